"""What an environment is to the env service: a factory from (seed, options) to a session object.

Each environment module (``mathtool``, ``pythoncode``, ``frozenlake``) exposes ``SPEC``; ``service``
looks them up by name. Options are validated by the factory, which raises ``SpecError`` naming
``options.<key>``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from treadle import errors


@dataclasses.dataclass(frozen=True)
class Outcome:
    observation: str
    done: bool
    reward: float | None = None
    info: dict[str, Any] = dataclasses.field(default_factory=dict)


class Environment(Protocol):
    async def reset(self) -> tuple[str, dict[str, Any]]:
        """The first observation and info (``reference``, ``reward_fn`` when the gateway scores it)."""
        ...

    async def step(self, action: str) -> Outcome: ...

    async def close(self) -> None: ...


@dataclasses.dataclass(frozen=True)
class Context:
    """What the service lends to environments (the code sandbox)."""

    sandbox: Any = None


Factory = Callable[[int, Mapping[str, Any], Context], Environment]


@dataclasses.dataclass(frozen=True)
class Spec:
    name: str
    description: str
    factory: Factory


def int_option(options: Mapping[str, Any], key: str, default: int, *, lo: int, hi: int) -> int:
    value = options.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise errors.SpecError(f"must be an integer in [{lo}, {hi}], got {value!r}", field=f"options.{key}")
    return value


def bool_option(options: Mapping[str, Any], key: str, default: bool) -> bool:
    value = options.get(key, default)
    if not isinstance(value, bool):
        raise errors.SpecError(f"must be a boolean, got {value!r}", field=f"options.{key}")
    return value


def check_keys(options: Mapping[str, Any], allowed: set[str]) -> None:
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise errors.SpecError(
            f"unknown option(s) {unknown}; allowed: {sorted(allowed)}", field=f"options.{unknown[0]}"
        )
