"""Policy names a RolloutJob may use, mapped to the pure functions that implement them.

Called by the scheduler and placement services when they start (from the job's
``rollout.schedulingPolicy`` / ``rollout.placementPolicy``) and by the simulator, so a name means
the same code in both. Later policies (DARTS selection, Tangram action scheduling) plug in by
adding an entry to the tables below with the same signature.

* A **placement policy** chooses the worker of one turn (see ``treadle.policy.placement``). Names in
  ``BATCH_PLACEMENT`` also place whole admitted batches and route every turn themselves
  (``treadle.policy.heddle_live``: Heddle's presorted DP, router and migration); their per-turn
  function is what serves a trajectory the router cannot (its worker left the pool).
* A **scheduling policy** orders the turns waiting for a generation slot: given the queue, it
  returns the trajectory ids in the order to dispatch them. Names in ``PREEMPTIVE_SCHEDULING`` also
  preempt lower-ranked running turns for a higher-ranked waiting one (``treadle.policy.preemption``).

Heddle (``heddle`` for both fields) ranks by the remaining length that the scheduler's runtime
predictor (``heddle.predictor``) gives after every step; ``progressive-priority`` is the same
ranking without preemption. Heddle's preemption is bounded on this stack
(``Settings.preemption_max_progress``): the agent drops an aborted turn's tokens where the paper's
SGLang keeps the preempted prefix, so only a turn early in its generation is a victim.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Protocol

from treadle.errors import SpecError
from treadle.policy import placement
from treadle.policy.heddle import priority

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
    predicted_remaining: float = 0.0
    """Tokens the runtime predictor expects the trajectory still to generate (0 before any history)."""
    tokens_so_far: int = 0
    """Tokens the trajectory has generated in its finished turns."""

    def request(self) -> priority.Request:
        """This turn as Heddle's priority module sees it."""
        return priority.Request(
            trajectory_id=self.trajectory_id, predicted_remaining=self.predicted_remaining, seq=self.seq,
            tokens_so_far=self.tokens_so_far,
        )  # fmt: skip


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


def rank_key(q: QueuedTurn) -> tuple[float, int, int, str]:
    """Heddle's progressive priority (``priority.priority``, LPT on predicted remaining tokens).

    Ties, which is every turn before the predictor has history, go to the trajectory further along
    (more turns done: under a heavy tail it is the likelier straggler), then first come first served.
    """
    return (-priority.priority(q.request()), -q.turn, q.seq, q.trajectory_id)


def progressive_priority(queue: Sequence[QueuedTurn]) -> list[str]:
    """Longest predicted remaining work first, re-ranked after every step, so long tails start sooner."""
    return [q.trajectory_id for q in sorted(queue, key=rank_key)]


PLACEMENT_POLICIES: Mapping[str, PlacementPolicy] = {
    "sticky-least-loaded": placement.choose_worker,
    "least-loaded": least_loaded,
    "heddle": placement.choose_worker,
}
BATCH_PLACEMENT = frozenset({"heddle"})
"""Placement policies that place admitted batches and route turns through ``heddle_live``."""
SCHEDULING_POLICIES: Mapping[str, SchedulingPolicy] = {
    "fifo": fifo,
    "progressive-priority": progressive_priority,
    "heddle": progressive_priority,
}
PREEMPTIVE_SCHEDULING = frozenset({"heddle"})
"""Scheduling policies that preempt running turns (``preemption.victims``)."""
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
