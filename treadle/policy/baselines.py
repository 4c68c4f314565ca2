"""Baseline placement policies the papers compare against, for the simulator and for ablations.

Called by ``treadle.sim`` when a scenario names a policy that ``treadle.policy.registry`` does not
serve live (``rollout.placementPolicy: pinned`` or ``round-robin``). They share the registry's
``PlacementPolicy`` signature so the simulator drives them exactly like the live policies.

* ``pinned`` -- verl's static cache-aware placement (Heddle digest, baselines): a trajectory stays on
  the worker of its first turn whatever the load; the first turn goes to the least-loaded worker.
* ``round-robin`` -- the worker that has been given the fewest turns so far (``assigned``), ties by
  id: over a whole sequence that is plain round-robin, and it ignores both load and cache.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from treadle.policy import placement, registry


def pinned(
    workers: Sequence[placement.WorkerState],
    *,
    eligible_pools: Sequence[str],
    previous: str | None = None,
    slack: int = placement.DEFAULT_SLACK,
    assigned: Mapping[str, int] | None = None,
) -> placement.Decision | None:
    """Keep the previous worker if it is still a healthy candidate; else least-loaded."""
    pools = set(eligible_pools)
    if previous is not None:
        for w in workers:
            if w.worker_id == previous and w.healthy and w.pool in pools:
                return placement.Decision(worker_id=w.worker_id, reason="sticky")
    return registry.least_loaded(workers, eligible_pools=eligible_pools, assigned=assigned)


def round_robin(
    workers: Sequence[placement.WorkerState],
    *,
    eligible_pools: Sequence[str],
    previous: str | None = None,
    slack: int = placement.DEFAULT_SLACK,
    assigned: Mapping[str, int] | None = None,
) -> placement.Decision | None:
    """The candidate given the fewest turns so far (ties by id); load and cache are ignored."""
    pools = set(eligible_pools)
    counts = assigned or {}
    candidates = [w for w in workers if w.healthy and w.pool in pools]
    if not candidates:
        return None
    best = min(candidates, key=lambda w: (counts.get(w.worker_id, 0), w.worker_id))
    return placement.Decision(worker_id=best.worker_id, reason="least-loaded")


PLACEMENT_POLICIES: Mapping[str, registry.PlacementPolicy] = {
    "pinned": pinned,
    "round-robin": round_robin,
}


def placement_policy(name: str) -> registry.PlacementPolicy:
    """The live policy called ``name`` if the registry has it, else the baseline of that name."""
    if name in PLACEMENT_POLICIES and name not in registry.PLACEMENT_POLICIES:
        return PLACEMENT_POLICIES[name]
    return registry.placement_policy(name)
