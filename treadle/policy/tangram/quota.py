"""API quotas as resource types (ARL-Tangram §4.1: "each website's API quota is a separate resource
type"): the limits one ``spec.externalResources.apiQuotas`` entry enforces, and what an action asks.

A quota is two flat pools shared by every env pod of a job: ``max_concurrent`` calls in flight, and
requests in a sliding window. The paper gives no window; the spec says "per minute". We enforce
``requestsPerMinute`` as ``R / k`` requests per sliding ``60 / k`` seconds, ``k`` the largest
divisor of ``R`` up to ``MAX_SPLIT`` (6: ten-second windows): any 60 s interval is the disjoint
union of ``k`` such windows, so it holds at most ``R`` requests, and a burst of a whole minute's
budget in one second (which real APIs refuse per second too) becomes at most a ``k``-th of it. A
prime ``R`` keeps the 60 s window. A request counts from its grant until ``window_s`` after its
release (a dead holder's: after its lease ran out): the API may see it at any moment in between.

``demand`` turns the tools an environment declares for one action into amounts per quota, and
refuses an action no quota could ever admit (more calls of a tool at once than its
``maxConcurrent`` or its window allows), naming the field. A tool without a quota is not limited.

Pure: the shell (``treadle.services.env.quotas``) keeps the state in Redis and runs the admission
atomically there, in FCFS order per tool.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterable, Mapping

from treadle.errors import SpecError

MINUTE_S = 60.0
MAX_SPLIT = 6
FIELD = "spec.externalResources.apiQuotas"


@dataclasses.dataclass(frozen=True)
class Limit:
    """What one quota admits: ``concurrent`` in flight, ``requests`` per sliding ``window_s``."""

    index: int
    """The quota's index in ``apiQuotas`` (errors name the field)."""
    tool: str
    concurrent: int
    requests: int
    window_s: float

    def __post_init__(self) -> None:
        if self.concurrent < 1 or self.requests < 1 or self.window_s <= 0:
            raise SpecError("a quota admits at least one call", field=f"{FIELD}[{self.index}]", value=self)


def limit(index: int, tool: str, *, requests_per_minute: int, max_concurrent: int) -> Limit:
    """The enforced form of one ``apiQuotas`` entry (module doc: ``R / k`` per ``60 / k`` s)."""
    if requests_per_minute < 1:
        raise SpecError(
            "must be >= 1", field=f"{FIELD}[{index}].requestsPerMinute", value=requests_per_minute
        )
    if max_concurrent < 1:
        raise SpecError(
            "must be >= 1: no call could ever run",
            field=f"{FIELD}[{index}].maxConcurrent",
            value=max_concurrent,
        )
    k = max(d for d in range(1, MAX_SPLIT + 1) if requests_per_minute % d == 0)
    return Limit(index, tool, max_concurrent, requests_per_minute // k, MINUTE_S / k)


def limits(entries: Iterable[tuple[str, int, int]]) -> dict[str, Limit]:
    """``(tool, requestsPerMinute, maxConcurrent)`` per entry -> limits by tool; a tool twice is an error."""
    out: dict[str, Limit] = {}
    for i, (tool, rpm, concurrent) in enumerate(entries):
        if tool in out:
            raise SpecError(f"tool {tool!r} has two quotas", field=f"{FIELD}[{i}].tool", value=tool)
        out[tool] = limit(i, tool, requests_per_minute=rpm, max_concurrent=concurrent)
    return out


def demand(tools: Iterable[str], quotas: Mapping[str, Limit]) -> dict[str, int]:
    """Calls per quota'd tool of one action (a tool named twice is two calls at once); tools
    without a quota are left out. An amount no quota can ever admit raises ``SpecError``."""
    counts = collections.Counter(t for t in tools if t in quotas)
    for tool, n in counts.items():
        q = quotas[tool]
        if n > q.concurrent:
            raise SpecError(
                f"an action calls {tool!r} {n} times at once, more than maxConcurrent {q.concurrent}: "
                "it could never run", field=f"{FIELD}[{q.index}].maxConcurrent", value=q.concurrent,
            )  # fmt: skip
        if n > q.requests:
            raise SpecError(
                f"an action calls {tool!r} {n} times at once, more than the {q.requests} requests a "
                f"{q.window_s:g} s window admits: it could never run",
                field=f"{FIELD}[{q.index}].requestsPerMinute", value=q.requests,
            )  # fmt: skip
    return dict(sorted(counts.items()))
