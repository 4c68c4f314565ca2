"""The scheduling orders and placement rules Heddle is compared against (§7 baselines, ablations).

Called by the simulator (``treadle.sim.heddle``) to run the baselines, and available to the live
scheduler for the same comparisons. Heddle's own policies are ``priority`` and ``presorted_dp``;
these are the alternatives its evaluation names, each pure and deterministic:

Scheduling (the order a worker admits waiting step requests; ties by trajectory id):

* ``round-robin``: a step request re-queues at the tail (order of arrival of *this step*), what
  step-centric frameworks (verl, slime) do: a trajectory of K steps pays K queueing penalties.
* ``fcfs``: first come first served at the trajectory level: the trajectory that entered the batch
  first keeps going first at every step (its batch index, since a synchronous batch starts at once).
* ``autellix``: Autellix's program-level least attained service (PLAS): the trajectory that has
  generated the fewest tokens so far goes first, to avoid head-of-line blocking by long programs.
* ``progressive``: Heddle, ``priority.order`` (LPT on the predicted remaining tokens).

Placement (per step; ``previous`` is the worker holding the trajectory's prefix cache):

* ``static``: verl: the whole trajectory is pinned at dispatch, ``index mod workers`` (cache
  affinity, no load awareness).
* ``cache-aware``: the longest prefix match, i.e. the previous worker; the first step goes to
  the least loaded (nothing is cached anywhere yet).
* ``least-load``: the SGLang router's hybrid, as verl* and the paper's least-load ablation use it:
  when the load is imbalanced (``max - min > abs_threshold`` and ``max > rel_threshold · min``)
  the step goes to the least-loaded worker, else to the previous one (cache-aware).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Literal

from treadle.errors import SpecError
from treadle.policy.heddle import priority

Scheduling = Literal["round-robin", "fcfs", "autellix", "progressive"]
SCHEDULINGS: tuple[Scheduling, ...] = ("round-robin", "fcfs", "autellix", "progressive")


@dataclasses.dataclass(frozen=True)
class Queued:
    """A waiting step request as the baselines see it."""

    trajectory_id: str
    step_seq: int
    """Arrival order of this step's request at the worker."""
    trajectory_seq: int
    """Arrival order of the trajectory in the batch."""
    attained: int
    """Tokens the trajectory has generated so far (its attained service)."""
    predicted_remaining: float = 0.0


def order(queue: Sequence[Queued], scheduling: Scheduling) -> list[str]:
    """Trajectory ids in the order the worker admits them."""
    if scheduling == "round-robin":
        return [q.trajectory_id for q in sorted(queue, key=lambda q: (q.step_seq, q.trajectory_id))]
    if scheduling == "fcfs":
        return [q.trajectory_id for q in sorted(queue, key=lambda q: (q.trajectory_seq, q.trajectory_id))]
    if scheduling == "autellix":
        return [
            q.trajectory_id for q in sorted(queue, key=lambda q: (q.attained, q.step_seq, q.trajectory_id))
        ]
    if scheduling == "progressive":
        requests = [
            priority.Request(q.trajectory_id, q.predicted_remaining, q.step_seq, q.attained) for q in queue
        ]
        return [r.trajectory_id for r in priority.order(requests)]
    raise SpecError(f"unknown scheduling {scheduling!r}; known: {list(SCHEDULINGS)}", field="scheduling")


@dataclasses.dataclass(frozen=True)
class Load:
    worker_id: str
    load: int
    """Requests running or waiting on the worker."""


def static(index: int, workers: Sequence[str]) -> str:
    """verl's pinning: trajectory ``index`` of the batch always runs on ``workers[index mod m]``."""
    if not workers:
        raise SpecError("at least one worker is needed", field="workers", value=[])
    return workers[index % len(workers)]


def _least(workers: Sequence[Load]) -> str:
    if not workers:
        raise SpecError("at least one worker is needed", field="workers", value=[])
    return min(workers, key=lambda w: (w.load, w.worker_id)).worker_id


def cache_aware(workers: Sequence[Load], previous: str | None) -> str:
    """The worker holding the trajectory's prefix; the least loaded for a first step."""
    if previous is not None and any(w.worker_id == previous for w in workers):
        return previous
    return _least(workers)


def least_load(
    workers: Sequence[Load], previous: str | None, *, abs_threshold: float = 32, rel_threshold: float = 1.0001
) -> str:
    """SGLang-router hybrid: least loaded when the load is imbalanced, else cache-aware.

    The defaults are the router's (``balance_abs_threshold=32``, ``balance_rel_threshold=1.0001``),
    which verl* uses; the paper's least-load ablation uses "a configurable threshold".
    """
    if abs_threshold < 0 or rel_threshold < 1:
        raise SpecError("needs abs_threshold >= 0 and rel_threshold >= 1", field="abs_threshold")
    least = _least(workers)
    loads = [w.load for w in workers]
    hi, lo = max(loads), min(loads)
    if previous is None or (hi - lo > abs_threshold and hi > rel_threshold * lo):
        return least
    return cache_aware(workers, previous)
