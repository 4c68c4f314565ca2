"""Policy names a RolloutJob may use, mapped to the pure functions that implement them.

Called by the scheduler and placement services when they start (from the job's
``rollout.schedulingPolicy`` / ``rollout.placementPolicy``) and by the simulator, so a name means
the same code in both. Later policies (Heddle progressive priority, DARTS selection, Tangram
action scheduling) plug in by adding an entry to the tables below with the same signature.

* A **placement policy** chooses the worker of one turn (see ``treadle.policy.placement``).
* A **scheduling policy** orders the turns waiting for a generation slot: given the queue, it
  returns the trajectory ids in the order to dispatch them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Protocol

from treadle.errors import SpecError
from treadle.policy import placement

PLACEMENT_FIELD = "rollout.placementPolicy"
SCHEDULING_FIELD = "rollout.schedulingPolicy"


class PlacementPolicy(Protocol):
    def __call__(
        self,
        workers: Sequence[placement.WorkerState],
        *,
        eligible_pools: Sequence[str],
        previous: str | None = None,
        slack: int = placement.DEFAULT_SLACK,
        assigned: Mapping[str, int] | None = None,
    ) -> placement.Decision | None: ...


@dataclasses.dataclass(frozen=True)
class QueuedTurn:
    """A trajectory waiting for a generation slot."""

    trajectory_id: str
    seq: int
    """When it joined the queue (smaller is earlier)."""
    turn: int
    """How many turns the trajectory has already generated."""
    task: str


class SchedulingPolicy(Protocol):
    def __call__(self, queue: Sequence[QueuedTurn]) -> list[str]: ...


def least_loaded(
    workers: Sequence[placement.WorkerState],
    *,
    eligible_pools: Sequence[str],
    previous: str | None = None,
    slack: int = placement.DEFAULT_SLACK,
    assigned: Mapping[str, int] | None = None,
) -> placement.Decision | None:
    """Least-loaded without stickiness (the baseline that forgets the trajectory's cache)."""
    return placement.choose_worker(workers, eligible_pools=eligible_pools, previous=None, assigned=assigned)


def fifo(queue: Sequence[QueuedTurn]) -> list[str]:
    """First come, first served."""
    return [q.trajectory_id for q in sorted(queue, key=lambda q: (q.seq, q.trajectory_id))]


def progressive_priority(queue: Sequence[QueuedTurn]) -> list[str]:
    """Trajectories further along go first, so long tails finish sooner.

    Heddle's progressive priority ranks by predicted remaining work from a runtime predictor; this
    first version uses turns already generated as the progress signal (ties: FIFO). The Heddle issue
    replaces the body with the predictor-based ranking under the same name.
    """
    return [q.trajectory_id for q in sorted(queue, key=lambda q: (-q.turn, q.seq, q.trajectory_id))]


PLACEMENT_POLICIES: Mapping[str, PlacementPolicy] = {
    "sticky-least-loaded": placement.choose_worker,
    "least-loaded": least_loaded,
}
SCHEDULING_POLICIES: Mapping[str, SchedulingPolicy] = {
    "fifo": fifo,
    "progressive-priority": progressive_priority,
}
DEFAULT_PLACEMENT = "sticky-least-loaded"
DEFAULT_SCHEDULING = "progressive-priority"


def placement_policy(name: str) -> PlacementPolicy:
    """The placement policy called ``name``; ``SpecError`` naming the job field if unknown."""
    try:
        return PLACEMENT_POLICIES[name]
    except KeyError:
        known = sorted(PLACEMENT_POLICIES)
        raise SpecError(
            f"unknown placement policy {name!r}; known: {known}", field=PLACEMENT_FIELD, value=name
        ) from None


def scheduling_policy(name: str) -> SchedulingPolicy:
    """The scheduling policy called ``name``; ``SpecError`` naming the job field if unknown."""
    try:
        return SCHEDULING_POLICIES[name]
    except KeyError:
        known = sorted(SCHEDULING_POLICIES)
        raise SpecError(
            f"unknown scheduling policy {name!r}; known: {known}", field=SCHEDULING_FIELD, value=name
        ) from None
