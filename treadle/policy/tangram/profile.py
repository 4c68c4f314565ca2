"""Duration profiles: historical averages and elasticity fitted from measured samples (§4.1, §4.2).

The paper profiles ``T_ori`` and ``E(m)`` "in advance" for CPU reward runs and reward-model
inference, and uses historical averages for every other action, without saying how. Ours:

* ``Average``: the mean of the last ``window`` observations of an action type, kept as a running
  mean whose weight is ``1 / min(count, window)`` (bounded memory; a plain mean until ``window``
  samples, an exponential average after, so the profile follows drift).
* ``fit``: Amdahl's law ``dur(m) = a + b / m`` fitted by least squares to samples ``(m, duration /
  T_ori)`` (durations normalised by the action's own one-unit estimate, so runs of different sizes
  share one curve), with ``a, b >= 0``. Then ``E(m) = (a + b) / (a m + b)``, which lies in (0, 1]
  for every m >= 1. Samples at fewer than two distinct amounts cannot show elasticity: ``None``
  (the action then runs at its minimum, as Alg. 1 line 6 does for unknown elasticity).

* ``KindProfile``: what a live manager learns of one action kind from its finished runs: an
  ``Average`` per amount granted and, once two amounts have runs, the fitted elasticity; it builds
  the kind's next ``model.Action``, probing the largest then the smallest amount until it can fit.
  Durations are normalised by the smallest amount's mean ``d0`` at ``m0``; the one-unit duration
  ``T_ori`` is then ``d0 (a + b) / (a + b / m0)`` (``d0`` itself when ``m0`` is 1).

Called by the simulator (from its probe runs) and by the live shell (from finished actions).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from treadle.errors import SpecError
from treadle.policy.tangram import model

DEFAULT_WINDOW = 256


@dataclasses.dataclass(frozen=True)
class Average:
    """A running average of one action type's duration."""

    mean: float = 0.0
    count: int = 0
    window: int = DEFAULT_WINDOW

    def observe(self, value: float) -> Average:
        if value < 0:
            raise SpecError("a duration is >= 0", field="value", value=value)
        count = self.count + 1
        weight = 1.0 / min(count, self.window)
        return dataclasses.replace(self, mean=self.mean + weight * (value - self.mean), count=count)


def fit(samples: Sequence[tuple[int, float]], max_units: int) -> model.Elasticity | None:
    """``E(m)``, ``m = 1 .. max_units``, from ``(units, normalised duration)`` samples (module doc)."""
    if max_units < 1:
        raise SpecError("must be >= 1", field="max_units", value=max_units)
    if any(m < 1 or d <= 0 for m, d in samples):
        raise SpecError("samples are (units >= 1, duration > 0)", field="samples")
    if len({m for m, _ in samples}) < 2:
        return None
    a, b = _least_squares([1.0 / m for m, _ in samples], [d for _, d in samples])
    if a + b <= 0:
        return None
    return model.Elasticity(tuple((a + b) / (a * m + b) for m in range(1, max_units + 1)))


def _least_squares(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """``(a, b) >= 0`` minimising ``Σ (a + b x - y)²`` (clamped to the boundary when negative)."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    a = my - b * mx
    if b < 0:  # no speed-up at all: a flat line
        return max(my, 0.0), 0.0
    if a < 0:  # better than linear in the samples: through the origin
        return 0.0, sum(x * y for x, y in zip(xs, ys, strict=True)) / sum(x * x for x in xs)
    return a, b


@dataclasses.dataclass
class KindProfile:
    """One action kind's durations per amount granted and its fitted elasticity (module doc)."""

    resource: str
    amounts: tuple[int, ...]
    """The amounts an action of the kind may be granted (ascending, at least one)."""
    by_units: dict[int, Average] = dataclasses.field(default_factory=dict)
    elasticity: model.Elasticity | None = None
    one_unit_s: float = 0.0
    """``T_ori``: the fitted one-unit duration (the smallest amount's mean until there is a fit)."""

    def __post_init__(self) -> None:
        if not self.amounts or list(self.amounts) != sorted(set(self.amounts)) or self.amounts[0] < 1:
            raise SpecError("amounts are distinct, ascending and >= 1", field="amounts", value=self.amounts)

    def observe(self, units: int, duration_s: float) -> None:
        self.by_units[units] = self.by_units.get(units, Average()).observe(duration_s)
        m0 = min(self.by_units)
        d0 = self.by_units[m0].mean
        if d0 <= 0:
            return
        samples = [(m, a.mean / d0) for m, a in sorted(self.by_units.items()) if a.mean > 0]
        self.elasticity = fit(samples, self.amounts[-1])
        self.one_unit_s = d0
        if self.elasticity is not None and m0 > 1:
            # E(m0) m0 = d(1)/d(m0) on the fitted curve, so T_ori = d0 E(m0) m0.
            self.one_unit_s = d0 * self.elasticity.efficiency[m0 - 1] * m0

    def action(self, action_id: str) -> model.Action:
        if self.elasticity is not None:
            return model.Action(
                action_id, self.resource, {self.resource: self.amounts},
                duration_s=self.one_unit_s, elasticity=self.elasticity,
            )  # fmt: skip
        probe = next(
            (m for m in (self.amounts[-1], self.amounts[0]) if m not in self.by_units), self.amounts[-1]
        )
        seen = self.by_units.get(probe)
        return model.Action(
            action_id, self.resource, {self.resource: (probe,)}, duration_s=seen.mean if seen else 0.0
        )
