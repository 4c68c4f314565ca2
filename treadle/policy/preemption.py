"""Which running generations to preempt for higher-ranked waiting ones (Heddle §4.2, Algorithm 1).

Called by the scheduler's generation gate whenever a turn waits while every slot is taken, under a
scheduling policy in ``registry.PREEMPTIVE_SCHEDULING``; the simulator can call it at the same
point. The decision is ``heddle.priority``'s Algorithm 1 (``run_to_completion``) over one queue:
the scheduler's gate bounds generations over all workers at once, so its slots are the gate's, not
one engine's.

Turns already being preempted still hold their slots until their engine answers the ABORT; the
waiting turns at the head of the queue will take those slots, so both are left out of the round
(otherwise one waiting turn would preempt a second victim while the first is still stopping).

What a preemption costs is the shell's business: the inference agent answers an ABORT with no
tokens (its ``abort`` drops what was generated), so the scheduler re-issues the turn from its
prompt and the engine re-generates it; vLLM's prefix cache keeps the prompt's KV if not evicted.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from treadle.errors import SpecError
from treadle.policy import registry
from treadle.policy.heddle import priority


def victims(
    running: Sequence[registry.QueuedTurn],
    waiting: Sequence[registry.QueuedTurn],
    *,
    slots: int,
    stopping: Collection[str] = (),
    margin: float = 0.0,
) -> list[str]:
    """Running trajectory ids to preempt now, in the order Algorithm 1 picks them.

    ``running`` holds every turn occupying a slot, ``stopping`` those already being preempted;
    ``waiting`` is the queue in any order. A victim is preempted only for a waiting turn whose
    predicted remaining work exceeds the victim's by more than ``margin`` (a fraction).
    """
    if slots < 0:
        raise SpecError("must be >= 0", field="slots", value=slots)
    if margin < 0:
        raise SpecError("must be >= 0", field="margin", value=margin)
    live = [q.request() for q in running if q.trajectory_id not in stopping]
    queue = priority.order(q.request() for q in waiting)[len(stopping) :]
    if not queue or not live:
        return []
    state = priority.WorkerQueue.of(live, queue, max(0, slots - len(stopping)))
    actions, _ = priority.run_to_completion(state, margin=margin)
    return [a.preempt for a in actions if a.preempt is not None]
