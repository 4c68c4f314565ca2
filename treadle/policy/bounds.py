"""A lower bound on the makespan of a rollout, so every policy is reported as a ratio to the limit.

Called by ``treadle.sim.engine`` at the end of a run (over the trajectories the trainer used) and by
``bench/``. A trajectory is a chain of segments that run one after another: GPU segments (a turn's
prefill + decode) and waits (reset, tool calls, reward), which need no GPU. Each GPU segment knows,
per pool, its *latency* (seconds alone on one worker, batch 1) and its *work* (worker-seconds it
consumes at the worker's best throughput; work <= latency when batching helps).

Two bounds, both valid for any placement and any order:

* **work**: every unit of work runs somewhere; with ``n_p`` workers in pool p,
  ``T >= sum over segments of min_p work / sum_p n_p``. Heterogeneous pools make this the fractional
  relaxation's weakest form (each segment on its cheapest pool, capacity pooled) -- still a bound.
* **critical path**: a chain cannot finish before its segments back to back, each on its fastest
  pool: ``T >= max over chains of sum(min_p latency) + waits``.

``lower_bound`` is their maximum (and any serial floor the caller adds, e.g. training steps).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence


@dataclasses.dataclass(frozen=True)
class Segment:
    """A GPU segment (``latency``/``work`` per pool) or a wait (``wait_s``; empty mappings)."""

    latency: Mapping[str, float] = dataclasses.field(default_factory=dict)
    work: Mapping[str, float] = dataclasses.field(default_factory=dict)
    wait_s: float = 0.0


Chain = Sequence[Segment]


def work_bound(chains: Sequence[Chain], workers: Mapping[str, int]) -> float:
    """Total minimum work over total workers (0 with no workers)."""
    capacity = sum(workers.values())
    if capacity <= 0:
        return math.inf if any(s.work for c in chains for s in c) else 0.0
    total = math.fsum(
        min(seg.work[p] for p in seg.work if p in workers) for chain in chains for seg in chain if seg.work
    )
    return total / capacity


def critical_path(chains: Sequence[Chain], workers: Mapping[str, int] | None = None) -> float:
    """The longest chain with each GPU segment on its fastest (present) pool."""
    best = 0.0
    for chain in chains:
        length = 0.0
        for seg in chain:
            if seg.latency:
                pools = [p for p in seg.latency if workers is None or workers.get(p, 0) > 0]
                length += min(seg.latency[p] for p in pools)
            length += seg.wait_s
        best = max(best, length)
    return best


def lower_bound(
    chains: Sequence[Chain], workers: Mapping[str, int], *, serial_s: float = 0.0
) -> dict[str, float]:
    """``{"work", "critical_path", "serial", "bound"}``: the parts and their maximum."""
    parts = {
        "work": work_bound(chains, workers),
        "critical_path": critical_path(chains, workers),
        "serial": serial_s,
    }
    parts["bound"] = max(parts.values())
    return parts
