"""Progressive priority scheduling with preemption on one worker (Heddle §4.2, Algorithm 1).

Called by the scheduler service at every step boundary (a trajectory's new generation request is
inserted with its fresh prediction) and at every admission round of a worker, and by the
simulator. The shell turns ``Action``s into engine calls. vLLM has no preempt call, so a
preemption is an ABORT of the running request, keeping the tokens it produced, and a re-ADD later
with them appended to the prompt; vLLM's prefix cache (APC) then serves that context unless it was
evicted meanwhile, which is the paper's "keep the radix-tree prefix" on SGLang.

Priority is an adaptive LPT (Graham 1969): the longer a trajectory is predicted to keep running,
the earlier its next step is served, so the batch's tail starts first. The key is the predicted
remaining tokens (``key="remaining"``, our default: LPT on remaining work) or the predicted total
(``key="total"``, remaining plus generated); the paper does not say which. Ties go to the earlier
arrival, then the id, so orders are total and deterministic.

Algorithm 1, one scheduler iteration on a worker (``next_action``): take the highest-priority
waiting request ``p``; if a running slot is free, admit it; otherwise let ``a`` be the
lowest-priority running request and, if ``p`` outranks ``a`` by more than ``margin`` (a fraction,
0 in the paper), preempt ``a`` back to the waiting queue and admit ``p``; else stop. Each action
strictly raises the running set's priorities, so ``run_to_completion`` ends; it is capped anyway.
Invariants (tested): never more running than slots; after completion no waiting request outranks
a running one by more than the margin while slots are full, and no slot is free while requests wait.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Iterable, Sequence
from typing import Literal

from treadle.errors import SpecError

Key = Literal["remaining", "total"]


@dataclasses.dataclass(frozen=True)
class Request:
    """A generation request of one trajectory step."""

    trajectory_id: str
    predicted_remaining: float
    """Tokens the predictor expects the trajectory still to generate."""
    seq: int
    """Arrival order at this worker (smaller is earlier)."""
    tokens_so_far: int = 0


@dataclasses.dataclass(frozen=True)
class WorkerQueue:
    """One worker's requests, both tuples in dispatch order (``of``, ``insert`` and ``apply`` keep it).

    The order is a precondition rather than re-checked on every call: a step update must stay far
    under 50 us, and the scheduler only ever edits the queues through ``insert``/``apply``.
    """

    running: tuple[Request, ...]
    waiting: tuple[Request, ...]
    slots: int
    """Most requests this worker decodes at once (the engine's running-batch cap)."""

    @staticmethod
    def of(
        running: Iterable[Request], waiting: Iterable[Request], slots: int, *, key: Key = "remaining"
    ) -> WorkerQueue:
        """Build from requests in any order."""
        return WorkerQueue(
            running=tuple(order(running, key=key)), waiting=tuple(order(waiting, key=key)), slots=slots
        )


@dataclasses.dataclass(frozen=True)
class Action:
    admit: str
    """The trajectory whose request starts running."""
    preempt: str | None = None
    """The running trajectory sent back to waiting to make room, if any."""


def priority(request: Request, *, key: Key = "remaining") -> float:
    """Higher runs first."""
    if key == "remaining":
        return request.predicted_remaining
    return request.predicted_remaining + request.tokens_so_far


def sort_key(request: Request, *, key: Key = "remaining") -> tuple[float, int, str]:
    """Ascending sort key: highest priority first, then earliest arrival, then id."""
    return (-priority(request, key=key), request.seq, request.trajectory_id)


def order(requests: Iterable[Request], *, key: Key = "remaining") -> list[Request]:
    """``requests`` in dispatch order."""
    return sorted(requests, key=lambda r: sort_key(r, key=key))


def ranks(requests: Iterable[Request], *, key: Key = "remaining") -> dict[str, int]:
    """Trajectory id -> rank (0 goes first); the scheduler exposes this per trajectory."""
    return {r.trajectory_id: i for i, r in enumerate(order(requests, key=key))}


def insert(waiting: Sequence[Request], request: Request, *, key: Key = "remaining") -> tuple[Request, ...]:
    """Put a step's new request into an ordered queue (replacing the trajectory's older one)."""
    kept = [r for r in waiting if r.trajectory_id != request.trajectory_id]
    at = bisect.bisect_left(kept, sort_key(request, key=key), key=lambda r: sort_key(r, key=key))
    kept.insert(at, request)
    return tuple(kept)


def next_action(state: WorkerQueue, *, key: Key = "remaining", margin: float = 0.0) -> Action | None:
    """One step of Algorithm 1; ``None`` when nothing should change."""
    if state.slots < 0:
        raise SpecError("must be >= 0", field="slots", value=state.slots)
    if margin < 0:
        raise SpecError("must be >= 0", field="margin", value=margin)
    if not state.waiting:
        return None
    head = state.waiting[0]
    if len(state.running) < state.slots:
        return Action(admit=head.trajectory_id)
    if not state.running:
        return None
    victim = state.running[-1]
    if priority(head, key=key) > priority(victim, key=key) * (1.0 + margin):
        return Action(admit=head.trajectory_id, preempt=victim.trajectory_id)
    return None


def apply(state: WorkerQueue, action: Action, *, key: Key = "remaining") -> WorkerQueue:
    """The queue after ``action`` (what the shell observes once the engine has done it)."""
    admitted = next((r for r in state.waiting if r.trajectory_id == action.admit), None)
    if admitted is None:
        raise SpecError(f"{action.admit!r} is not waiting", field="action.admit", value=action.admit)
    waiting = tuple(r for r in state.waiting if r is not admitted)
    running = insert(state.running, admitted, key=key)
    if action.preempt is not None:
        victim = next((r for r in running if r.trajectory_id == action.preempt), None)
        if victim is None:
            raise SpecError(
                f"{action.preempt!r} is not running", field="action.preempt", value=action.preempt
            )
        running = tuple(r for r in running if r is not victim)
        waiting = insert(waiting, victim, key=key)
    return WorkerQueue(running=running, waiting=waiting, slots=state.slots)


def run_to_completion(
    state: WorkerQueue, *, key: Key = "remaining", margin: float = 0.0, max_steps: int | None = None
) -> tuple[list[Action], WorkerQueue]:
    """Every action of one admission round, and the queue after them (tables in tests, sim)."""
    cap = max_steps if max_steps is not None else 2 * (len(state.running) + len(state.waiting)) ** 2 + 10
    actions: list[Action] = []
    for _ in range(cap):
        action = next_action(state, key=key, margin=margin)
        if action is None:
            return actions, state
        actions.append(action)
        state = apply(state, action, key=key)
    raise RuntimeError(f"priority round did not settle in {cap} steps")
