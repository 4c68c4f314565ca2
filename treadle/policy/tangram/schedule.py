"""Alg. 1 (elastic resource scheduling) and Alg. 2 (ACT approximation) of ARL-Tangram (§4.2, App. A).

``decide`` is one scheduling round: the waiting queue ``W`` (FCFS), the executing actions and the
pools in, the grants out (every other action stays queued, in order). The objective is Eq. 2, the
sum of the queued actions' ACTs.

1. **Admission** (line 3): the candidates are the longest FCFS prefix whose minimum cost vectors
   every pool accommodates together (``pools.Pool.take``).
2. **Groups** (lines 4-7): candidates are split by key elasticity resource; a group with no scalable
   action (elasticity unknown or one feasible amount) is granted its minimums.
3. **Greedy eviction** (lines 8-13): the objective of the whole group, then of ever shorter
   prefixes (the last candidate evicted: it stays queued, its units go to the rest through the
   DP), stopping at the first eviction that does not lower it. Fixes (digest §0): keep the
   ``len - t + 1`` actions before the non-improving eviction (bug #2: the listing's ``C[:-t+1]`` is
   empty at ``t = 1``). Bug #3 (evicting every candidate could schedule nothing, for ever): the
   head may be evicted only while running actions hold units of its key resource. Evicting it
   wins only when the estimate prefers it to wait for one of its first ``depth`` amounts, so it
   waits at most until completions free that amount; every round is FCFS, nothing passes it, and
   with nothing running it always runs. The digest's stricter cap (``t <= len - 1``: the head runs
   at once on whatever is free) is ``head_always_runs``; in the simulator it pins long reward
   runs to the one core free at that instant and loses (``bench/reports/tangram.md``).
4. **Objective** (Alg. 2): the candidates' exact ACT sum from DPArrange (``dparrange``), plus an
   estimate for the group's queued actions behind them: list scheduling on the completion heap
   (one entry per unit of the key resource: running actions' expected ends, the candidates'
   granted durations, 0 for idle units), each at its minimum, the first also at its next
   ``depth - 1`` feasible amounts (the best is kept). Fixes: the depth loop pops its own copy
   (bug #4), the inner loop starts at the second action (bug #5), the heap is built from the DP's
   allocation (bug #6), and an action of ``u`` units pops ``u`` entries, starts at the latest and
   pushes ``u`` ends (the listing pops one per action whatever its size).

Ours where the paper is silent: ``horizon`` caps how many queued actions behind the candidates
the estimate list-schedules (the same count for every eviction step, so the sums compare like
with like); ``None`` is the paper's whole queue. ``depth`` counts feasible amounts, not units, so
GPU sets {1, 2, 4, 8} explore 1 then 2 GPUs at depth 2.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections.abc import Mapping, Sequence

from treadle.errors import SpecError
from treadle.policy.tangram import dparrange, model, pools

DEFAULT_DEPTH = 2
"""The paper's evaluation setting ("depth = 2 or 3 is sufficient")."""


@dataclasses.dataclass(frozen=True)
class Settings:
    depth: int = DEFAULT_DEPTH
    horizon: int | None = None
    """Queued actions behind the candidates that Alg. 2 estimates (``None``: all of them)."""
    head_always_runs: bool = False
    """Never evict the head (the digest's fix for bug #3) instead of the bounded wait (module doc)."""

    def __post_init__(self) -> None:
        if self.depth < 1:
            raise SpecError("must be >= 1", field="depth", value=self.depth)
        if self.horizon is not None and self.horizon < 0:
            raise SpecError("must be >= 0 or None", field="horizon", value=self.horizon)


def decide(
    waiting: Sequence[model.Action],
    running: Sequence[model.Running],
    status: Mapping[str, pools.Pool],
    settings: Settings = Settings(),
) -> list[model.Grant]:
    """One round of Alg. 1; the grants in FCFS order (empty: nothing fits now)."""
    candidates = admit(waiting, status)
    groups: dict[str, list[model.Action]] = {}
    for a in candidates:
        groups.setdefault(a.key, []).append(a)
    amounts: dict[str, int] = {a.id: a.min_units for a in candidates}
    selected: set[str] = set()
    for key, group in groups.items():
        if not any(a.scalable for a in group):
            selected.update(a.id for a in group)
            continue
        others = [a for a in candidates if a.key != key]
        kept, granted = _evict(key, group, waiting, running, others, status, settings)
        selected.update(a.id for a in group[:kept])
        amounts.update(zip((a.id for a in group), granted, strict=False))
    return [
        model.Grant(a.id, {r: amounts[a.id] if r == a.key else a.minimum(r) for r in a.cost})
        for a in candidates
        if a.id in selected
    ]


def admit(waiting: Sequence[model.Action], status: Mapping[str, pools.Pool]) -> list[model.Action]:
    """Alg. 1 line 3: the longest FCFS prefix whose minimum amounts all fit together."""
    state: dict[str, object] = {r: p.start() for r, p in status.items()}
    candidates: list[model.Action] = []
    for a in waiting:
        after = dict(state)
        for r in a.cost:
            if r not in status:
                raise SpecError(f"no pool for resource type {r!r}", field=f"cost.{r}", value=a.id)
            taken = status[r].take(after[r], a.minimum(r))
            if taken is None:
                return candidates
            after[r] = taken
        state = after
        candidates.append(a)
    return candidates


def _evict(
    key: str,
    group: Sequence[model.Action],
    waiting: Sequence[model.Action],
    running: Sequence[model.Running],
    others: Sequence[model.Action],
    status: Mapping[str, pools.Pool],
    settings: Settings,
) -> tuple[int, tuple[int, ...]]:
    """Lines 8-13 for one group: (how many of its candidates run, their amounts)."""
    pool = status[key]
    reserved = pool.start()
    for a in others:
        reserved = pool.take(reserved, a.minimum(key))
    table = dparrange.arrange(pool.operator(reserved, len(group)), group)
    queue = [a for a in waiting if a.key == key]
    end = len(queue) if settings.horizon is None else len(group) + settings.horizon
    base = [r.remaining_s for r in running if r.key == key for _ in range(r.units)]
    base += [a.min_duration for a in others for _ in range(a.minimum(key))]

    def objective(count: int) -> tuple[float, tuple[int, ...]]:
        exact, granted = table.best(count)
        if not math.isfinite(exact):
            return exact, granted
        heap = base + [t.duration(k) for t, k in zip(group[:count], granted, strict=True) for _ in range(k)]
        heap += [0.0] * max(0, pool.total - len(heap))
        heapq.heapify(heap)
        return exact + estimate(heap, queue[count:end], settings.depth), granted

    keep = len(group)
    obj, granted = objective(keep)
    # Bug #3: the head may be evicted only while running actions hold units of this resource, so
    # a completion brings another round; it then runs once the units its estimate waited for are
    # free (at worst when nothing runs). ``head_always_runs``: the digest's cap, t <= len - 1.
    defer = not settings.head_always_runs and any(r.key == key for r in running)
    for t in range(1, len(group) + defer):
        new, new_granted = objective(len(group) - t)
        if new >= obj:
            break  # bug #2: keep the len - t + 1 actions before this eviction
        obj, granted, keep = new, new_granted, len(group) - t
    return keep, granted


def estimate(heap: Sequence[float], remaining: Sequence[model.Action], depth: int) -> float:
    """Alg. 2 ``estimate``: the ACT sum of ``remaining`` list-scheduled on the completion ``heap``."""
    if not remaining:
        return 0.0
    first, rest = remaining[0], remaining[1:]
    best = math.inf
    for k in first.options[:depth]:
        h = list(heap)  # bug #4: each depth option runs on its own copy
        total = _run(h, k, first.duration(k))
        for a in rest:  # bug #5: the rest start at the second action
            if a.min_units == 1:  # the common case, inlined: one entry replaced
                end = h[0] + a.min_duration
                heapq.heapreplace(h, end)
                total += end
            else:
                total += _run(h, a.min_units, a.min_duration)
        best = min(best, total)
    return best


def _run(heap: list[float], units: int, duration: float) -> float:
    """List-schedule one action of ``units`` units on ``heap``; its completion time."""
    if units == 1:
        end = heap[0] + duration
        heapq.heapreplace(heap, end)
        return end
    units = min(units, len(heap))
    start = max(heapq.heappop(heap) for _ in range(units))
    end = start + duration
    for _ in range(units):
        heapq.heappush(heap, end)
    return end
