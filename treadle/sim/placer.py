"""Turn placement for ``treadle.sim.engine``: ``rollout.placementPolicy`` over a shortlist of workers.

Placement is exact but not O(workers) per turn: the policies in ``SHORTLIST`` depend only on the
least worker by a known key and on the previous worker, so the placer keeps one heap per pool and
passes the policy that shortlist (``tests/unit/sim/test_shortlist.py`` checks the decision equals
the one over all workers). Policies not listed get every worker.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping

from treadle import errors
from treadle.policy import baselines, placement, registry
from treadle.sim import entities

SHORTLIST: Mapping[str, str] = {
    "sticky-least-loaded": "load",
    "least-loaded": "load",
    "pinned": "load",
    "round-robin": "assigned",
}
"""Placement policies whose decision depends only on the minimum by this key and the previous worker."""


class Placer:
    """The placement policy named ``policy`` (or a ``baselines`` one) over ``pool_workers``."""

    def __init__(
        self, policy: str, workers: list[entities.Worker], pool_workers: Mapping[str, list[entities.Worker]]
    ) -> None:
        self.place: registry.PlacementPolicy = baselines.placement_policy(policy)
        self.workers = workers
        self.pool_workers = pool_workers
        self.by_id = {w.worker_id: w for w in workers}
        self._heaps: dict[str, list[tuple[tuple[object, ...], int, int]]] = {p: [] for p in pool_workers}
        self._stamp = [0] * len(workers)
        self._key_kind = SHORTLIST.get(policy)
        for w in workers:
            self.touch(w)

    def _key(self, w: entities.Worker) -> tuple[object, ...]:
        if self._key_kind == "assigned":
            return (w.assigned, w.worker_id)
        return (w.load, w.kv_usage_seen, w.assigned, w.worker_id)

    def touch(self, w: entities.Worker) -> None:
        """Record a change of ``w``'s placement key (load, KV usage as last reported, turns given)."""
        w.kv_usage_seen = w.kv_usage
        self._stamp[w.idx] += 1
        if self._key_kind is None:
            return
        heap = self._heaps[w.pool]
        heapq.heappush(heap, (self._key(w), self._stamp[w.idx], w.idx))
        if len(heap) > 8 * len(self.pool_workers[w.pool]) + 64:
            fresh = [(self._key(x), self._stamp[x.idx], x.idx) for x in self.pool_workers[w.pool]]
            heapq.heapify(fresh)
            self._heaps[w.pool] = fresh

    def _top(self, pool: str) -> entities.Worker | None:
        heap = self._heaps[pool]
        while heap:
            _, stamp, idx = heap[0]
            if stamp == self._stamp[idx]:
                return self.workers[idx]
            heapq.heappop(heap)
        return None

    def choose(self, traj: entities.Trajectory, pools: tuple[str, ...]) -> entities.Worker:
        """The worker for ``traj``'s next turn among ``pools``."""
        previous = self.workers[traj.worker] if traj.worker >= 0 else None
        if self._key_kind is None:
            shortlist = [w for p in pools for w in self.pool_workers[p]]
        else:
            shortlist = [w for w in (self._top(p) for p in pools) if w is not None]
            if previous is not None and previous not in shortlist:
                shortlist.append(previous)
        decision = self.place(
            [state(w) for w in shortlist],
            eligible_pools=pools,
            previous=previous.worker_id if previous is not None else None,
            assigned={w.worker_id: w.assigned for w in shortlist},
        )
        if decision is None:
            raise errors.Unavailable(f"no worker in pools {list(pools)} for {traj.name}")
        return self.by_id[decision.worker_id]


def state(w: entities.Worker) -> placement.WorkerState:
    """What the placement policy sees of ``w`` (KV usage as last reported, as the live service does)."""
    return placement.WorkerState(
        worker_id=w.worker_id, pool=w.pool, load=w.load, kv_cache_usage=w.kv_usage_seen
    )
