"""The unified action model of ARL-Tangram (§4.1): cost vectors, feasible sets, elasticity.

An action is one atomic invocation of external resources (a tool call, a test run, a judge or
teacher forward). Its cost is a vector over resource types (CPU cores of a node, the GPUs of a
pool, one type per external API's concurrency or quota, memory...), each entry a *feasible set*:
the ascending amounts the action can run with (a scalar is a one-element set, a range ``[lo, hi]``
every integer between, GPU tensor parallelism ``(1, 2, 4, 8)``). Exactly one resource is the *key
elasticity resource*: the amount of it sets the duration (Eq. 1),

    getDur(m) = T_ori / (E(m) · m),   0 < E(m) <= 1,

with ``T_ori`` the duration on one unit and ``E`` the parallel efficiency. ``E ≡ 1/m`` is a
non-scalable action. Scaling the key resource leaves the other entries at their minimum.

Built by the simulator and the live shell from their own records; read by ``schedule``.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping

from treadle.errors import SpecError


@dataclasses.dataclass(frozen=True)
class Elasticity:
    """``E(m)`` for ``m = 1 .. len(efficiency)`` units of the key resource (profiled: ``profile.fit``)."""

    efficiency: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.efficiency or any(not 0.0 < e <= 1.0 + 1e-9 for e in self.efficiency):
            raise SpecError("every E(m) must be in (0, 1]", field="efficiency", value=self.efficiency)

    @property
    def max_units(self) -> int:
        return len(self.efficiency)

    def duration(self, t_ori: float, m: int) -> float:
        """Eq. 1: the duration on ``m`` units of an action that takes ``t_ori`` on one."""
        return t_ori / (self.efficiency[m - 1] * m)


@dataclasses.dataclass(frozen=True, eq=False)
class Action:
    """One queued action: its cost vector, key resource and duration model."""

    id: str
    key: str
    """The key elasticity resource type (a key of ``cost``)."""
    cost: Mapping[str, tuple[int, ...]]
    """Resource type -> the ascending amounts the action can run with."""
    duration_s: float
    """``T_ori`` (one unit) when ``elasticity`` is known, else the historical average duration."""
    elasticity: Elasticity | None = None
    """``None``: unknown, the action runs at its minimum (Alg. 1 line 6)."""

    def __post_init__(self) -> None:
        if self.key not in self.cost:
            raise SpecError(f"the key resource {self.key!r} is not in the cost vector", field="key")
        for resource, amounts in self.cost.items():
            if not amounts or list(amounts) != sorted(set(amounts)) or amounts[0] < 0:
                raise SpecError(
                    "must be a non-empty ascending set of amounts >= 0",
                    field=f"cost.{resource}",
                    value=amounts,
                )
        if self.cost[self.key][0] < 1:
            raise SpecError("the key resource needs at least one unit", field=f"cost.{self.key}")
        if self.duration_s < 0:
            raise SpecError("must be >= 0", field="duration_s", value=self.duration_s)

    @functools.cached_property
    def options(self) -> tuple[int, ...]:
        """The amounts of the key resource the scheduler may grant (the minimum alone if inelastic)."""
        amounts = self.cost[self.key]
        if self.elasticity is None:
            return amounts[:1]
        return tuple(m for m in amounts if m <= self.elasticity.max_units) or amounts[:1]

    @property
    def scalable(self) -> bool:
        return len(self.options) > 1

    @functools.cached_property
    def min_units(self) -> int:
        return self.cost[self.key][0]

    def minimum(self, resource: str) -> int:
        """The least amount of ``resource`` the action needs (0 if it uses none)."""
        amounts = self.cost.get(resource)
        return amounts[0] if amounts else 0

    def duration(self, m: int) -> float:
        """Expected duration on ``m`` units of the key resource."""
        if self.elasticity is None or m > self.elasticity.max_units:
            return self.duration_s
        return self.elasticity.duration(self.duration_s, m)

    @functools.cached_property
    def min_duration(self) -> float:
        """``duration(min_units)``: how Alg. 2 estimates the queued actions."""
        return self.duration(self.min_units)

    @functools.cached_property
    def durations(self) -> tuple[float, ...]:
        """``duration(m)`` for each of ``options``."""
        return tuple(self.duration(m) for m in self.options)


@dataclasses.dataclass(frozen=True)
class Running:
    """An executing action as the completion heap sees it (Alg. 2's executing queue ``E``)."""

    key: str
    units: int
    remaining_s: float
    """Expected time until it completes (its expected duration minus its time so far, >= 0)."""


@dataclasses.dataclass(frozen=True)
class Grant:
    """A decision: run ``action_id`` now with ``units`` of each resource of its cost vector."""

    action_id: str
    units: Mapping[str, int]
