"""Which running generations to preempt for higher-ranked waiting ones (Heddle §4.2, Algorithm 1).

Called by the scheduler's generation gate whenever a turn waits while every slot is taken, under a
scheduling policy in ``registry.PREEMPTIVE_SCHEDULING``; the simulator can call it at the same
point. The decision is ``heddle.priority``'s Algorithm 1 (``run_to_completion``) over one queue:
the scheduler's gate bounds generations over all workers at once, so its slots are the gate's, not
one engine's.

Turns already being preempted still hold their slots until their engine answers the ABORT; the
waiting turns at the head of the queue will take those slots, so both are left out of the round
(otherwise one waiting turn would preempt a second victim while the first is still stopping).

What a preemption costs: the inference agent answers an ABORT with no tokens (its ``abort`` drops
what was generated), so the scheduler re-issues the turn from its prompt and the engine
re-generates it; vLLM's prefix cache keeps the prompt's KV if not evicted. The paper's SGLang keeps
the preempted request's radix-tree prefix, so a preemption there wastes almost nothing; here it
wastes the victim's progress in its current turn. ``max_progress`` bounds that waste: a running
turn further along its turn than this fraction (``progress``: the caller's estimate, elapsed time
over a typical turn's) is not a victim and keeps its slot (the digest's "minimum quantum" against
thrash). The common case it stops: a top-ranked trajectory comes back from a few-ms tool call, its
slot went to a lower-ranked turn meanwhile, and that turn is preempted at once (cheap: progress
near 0); but a turn nearly done is no longer thrown away for it.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence

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
    progress: Mapping[str, float] | None = None,
    max_progress: float = math.inf,
) -> list[str]:
    """Running trajectory ids to preempt now, in the order Algorithm 1 picks them.

    ``running`` holds every turn occupying a slot, ``stopping`` those already being preempted;
    ``waiting`` is the queue in any order. A victim is preempted only for a waiting turn whose
    predicted remaining work exceeds the victim's by more than ``margin`` (a fraction), and only
    while its ``progress`` in its current turn (a fraction; missing is 0) is at most
    ``max_progress`` (the default, infinity, is Algorithm 1 unbounded).
    """
    if slots < 0:
        raise SpecError("must be >= 0", field="slots", value=slots)
    if margin < 0:
        raise SpecError("must be >= 0", field="margin", value=margin)
    if not max_progress >= 0:
        raise SpecError("must be >= 0", field="max_progress", value=max_progress)
    progress = progress or {}
    candidates = [q for q in running if q.trajectory_id not in stopping]
    # Turns past the bound keep their slots: Algorithm 1 runs over the slots the rest hold.
    live = [q.request() for q in candidates if progress.get(q.trajectory_id, 0.0) <= max_progress]
    protected = len(candidates) - len(live)
    queue = priority.order(q.request() for q in waiting)[len(stopping) :]
    if not queue or not live:
        return []
    state = priority.WorkerQueue.of(live, queue, max(0, slots - len(stopping) - protected))
    actions, _ = priority.run_to_completion(state, margin=margin)
    return [a.preempt for a in actions if a.preempt is not None]
