"""Sticky least-loaded choice of an inference worker for one trajectory turn (placement v1).

Called by the placement service (``treadle.services.placement``) for every turn and by the
simulator for every simulated turn; both convert their state into the plain dataclasses below.

Rule, in order (RollArt §1.2 routes by task tag to a pool; within a pool the paper gives no policy,
so we take the consensus of SkyRL #1791 / prime-rl #3563, "sticky least-loaded by session"):

1. Candidates are the healthy workers whose pool is in ``eligible_pools`` (the hardware-affinity
   filter, computed by ``treadle.policy.affinity.eligible_pools``). No candidate -> ``None``.
2. Sticky: if the trajectory's previous worker is a candidate and its load is at most
   ``min_load + slack``, keep it (its KV/prefix cache holds the trajectory's context).
3. Otherwise the least-loaded candidate, ties broken by KV-cache usage, then by how many turns this
   decision sequence already gave it (so ties do not pin every new session onto one worker, the
   torchtitan PR #4109 bug), then by worker id.

Load is whatever the shell counts as outstanding work (running + waiting requests as reported by
the worker, plus turns assigned since the report). Invariants (tested): the chosen worker is always
healthy and eligible; a sticky choice is never more than ``slack`` above the least-loaded candidate.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Literal

DEFAULT_SLACK = 2
"""How much more loaded than the least-loaded candidate a sticky worker may be and still be kept."""


@dataclasses.dataclass(frozen=True)
class WorkerState:
    """One inference worker as placement sees it."""

    worker_id: str
    pool: str
    load: int
    kv_cache_usage: float = 0.0
    healthy: bool = True


@dataclasses.dataclass(frozen=True)
class Decision:
    """Where a turn goes and why (``reason`` is a metric label and shows in traces)."""

    worker_id: str
    reason: Literal["sticky", "least-loaded", "routed", "migrated"]
    """``routed``/``migrated``: a batch-level policy's router chose it (``heddle_live``)."""


def choose_worker(
    workers: Sequence[WorkerState],
    *,
    eligible_pools: Sequence[str],
    previous: str | None = None,
    slack: int = DEFAULT_SLACK,
    assigned: Mapping[str, int] | None = None,
) -> Decision | None:
    """Pick the worker for one turn; ``None`` when no healthy worker sits in an eligible pool."""
    pools = set(eligible_pools)
    candidates = [w for w in workers if w.healthy and w.pool in pools]
    if not candidates:
        return None
    counts = assigned or {}
    min_load = min(w.load for w in candidates)
    if previous is not None:
        for w in candidates:
            if w.worker_id == previous and w.load <= min_load + slack:
                return Decision(worker_id=w.worker_id, reason="sticky")
    best = min(candidates, key=lambda w: (w.load, w.kv_cache_usage, counts.get(w.worker_id, 0), w.worker_id))
    return Decision(worker_id=best.worker_id, reason="least-loaded")


@dataclasses.dataclass(frozen=True)
class TurnRequest:
    """One turn to place: its trajectory and the worker of its previous turn, if any."""

    trajectory_id: str
    previous: str | None = None


def assign_sequence(
    turns: Sequence[TurnRequest],
    workers: Sequence[WorkerState],
    *,
    eligible_pools: Sequence[str],
    slack: int = DEFAULT_SLACK,
) -> list[Decision | None]:
    """Place ``turns`` one after another, each adding one unit of load to its worker.

    This is the whole-sequence form used by the simulator and by the tests (lws-style tables); the
    service calls ``choose_worker`` once per turn with live loads instead.
    """
    state = {w.worker_id: w for w in workers}
    assigned: dict[str, int] = {}
    out: list[Decision | None] = []
    for turn in turns:
        decision = choose_worker(
            list(state.values()),
            eligible_pools=eligible_pools,
            previous=turn.previous,
            slack=slack,
            assigned=assigned,
        )
        out.append(decision)
        if decision is not None:
            chosen = state[decision.worker_id]
            state[decision.worker_id] = dataclasses.replace(chosen, load=chosen.load + 1)
            assigned[decision.worker_id] = assigned.get(decision.worker_id, 0) + 1
    return out
