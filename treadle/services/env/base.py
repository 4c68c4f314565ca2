"""What an environment is to the env service: a factory from (seed, options) to a session object.

Each environment module (``mathtool``, ``pythoncode``, ``frozenlake``) exposes ``SPEC``; ``service``
looks them up by name. Options are validated by the factory, which raises ``SpecError`` naming
``options.<key>``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

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


@runtime_checkable
class UsesTools(Protocol):
    """An environment whose actions call external tools declares which, before the step runs.

    ``tools_for(action)``: the tools the step will call, a tool once per call made at the same
    time (``["web-search"]``). The env service holds the job's quota for each
    (``spec.externalResources.apiQuotas``, enforced across all env pods) before the step starts and
    releases it after, so the step itself never sees a rate limit. A tool with no quota is not
    limited. Environments without the method call no quota'd tool.
    """

    def tools_for(self, action: str) -> list[str]: ...


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
