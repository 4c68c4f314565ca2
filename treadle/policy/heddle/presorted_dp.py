"""Presorted partition of a rollout batch over inference workers (Heddle §5.1-5.2, Eq. 2-3).

Called by the placement service when a rollout batch is dispatched (it pins each trajectory to the
group's worker; ``migration`` corrects it at runtime), by ``tp_planner`` as its cost function, and
by the simulator.

Objective, Eq. (2): split the trajectories into groups ``G_1..G_m``, group ``j`` on worker ``j``::

    minimise  max_j  I_j(|G_j|) · t_base_j · max_{τ ∈ G_j} L(τ)

``L`` is the predicted length, ``t_base_j`` the worker's contention-free seconds per token and
``I_j(s) >= 1`` its interference factor for a group of ``s`` trajectories (monotone, a function of
the group size only: the paper's premise 3). Lemma 5.1: with trajectories sorted by descending
length, some optimal partition is contiguous, so only the split points are searched. The paper's
DP (Eq. 3, ``solve_dp``)::

    D[i][j] = min_k max(D[k][j-1], L_{k+1} · I_j(i-k) · t_base_j),   answer D[n][m]

Two choices of ours where the paper is silent:

* A worker may be left empty (``k`` ranges over ``0..i``, Eq. 3 uses ``j-1..i-1``). On identical
  workers with ``n >= m`` this never changes the optimum; on a heterogeneous pool it lets the
  planner skip a worker that would only slow the batch down.
* ``solve`` (the default) reaches the same optimum faster by parametric search: for a bound ``T``,
  filling the workers in order, each with as many trajectories as fit under ``T``, is feasible
  iff any contiguous partition is (the greedy prefix always reaches at least as far, because a
  later start has a shorter head and so fits at least as many). ``T`` is bisected between a proven
  lower bound and an achieved makespan, both snapped to candidate values ``L_k · I_j(s) · t_base_j``
  (an infeasible ``T`` lifts the bound to the next value at which any worker could take one more
  trajectory), so it ends exactly on the optimum. One test costs ``O(m log n)``.

Eq. (2) fixes only the slowest group, so with a long tail (the longest trajectory alone sets the
bound) many partitions tie, including one that packs everything onto the first workers. ``plan``
therefore places by ``balanced``: at the optimal bound, each worker takes an even share of what is
left, clamped to what fits and to what the later workers cannot absorb (ours).

Slots (ours): a worker behind a gate of ``c`` slots (``WorkerProfile.slots``) runs at most ``c``
of its group at once, so a group of ``s > c`` costs ``I(c) · t_base · max(L_head, ΣL / c)``: it
lasts at least as long as its longest member and as its total work spread over the slots (a lower
bound; list scheduling is within 4/3 of it). The cost still grows with the group's end and falls
with its start, so the search below is unchanged and exact over contiguous partitions, but Lemma
5.1 no longer holds (a long member can pay for short ones beside it), so contiguity is now our
restriction, not the optimum's shape. ``slots = 0`` is Eq. (2) as written.

``I`` comes as a table per worker: ``interference_by_simulation`` follows the paper (simulate a
group's continuous-batching execution from profiled step times); ``interference_from_step_times``
is the crude closed form, an upper bound.

Short-trajectory merging (§5.2 heuristic, threshold unspecified): trajectories predicted shorter
than ``Merge.below`` are fused, in sorted order, into blocks of ``Merge.block``; a block counts its
members towards the group size and is never split, which shrinks the search at a small loss.

Workers are taken in descending TP degree (then ``t_base``, then id): the paper's sort-initialised
mapping gives the longest trajectories the highest TP. Invariants (tested): every trajectory is
placed exactly once; groups are contiguous in the sorted order; the makespan equals the brute-force
optimum on small inputs.
"""

from __future__ import annotations

import bisect
import dataclasses
import heapq
import itertools
import math
import operator
from collections.abc import Sequence

from treadle.errors import SpecError
from treadle.policy.heddle import grouping

MAX_SEARCH_STEPS = 512
"""Bound on the parametric bisection; it ends far sooner (tens of steps), the cap only guards floats."""


@dataclasses.dataclass(frozen=True)
class WorkerProfile:
    """One rollout worker as the partition sees it."""

    worker_id: str
    t_base: float
    """Contention-free seconds per generated token at batch size one."""
    interference: tuple[float, ...]
    """``I(s)`` for groups of ``s = 1..len`` trajectories, non-decreasing; larger groups do not fit."""
    tp: int = 1
    slots: int = 0
    """Trajectories the worker generates at once (its gate); 0: its whole group at once (Eq. 2)."""

    def __post_init__(self) -> None:
        # checked once here rather than on every plan: tables are long and plans are hot
        if not (self.t_base > 0 and math.isfinite(self.t_base)):
            raise SpecError("must be a positive number of seconds", field="t_base", value=self.t_base)
        table = self.interference
        if not table or not (min(table) > 0 and math.isfinite(max(table))):
            raise SpecError("needs positive finite factors", field="interference", value=table)
        if not all(map(operator.le, table, table[1:])):
            raise SpecError("must be non-decreasing in group size", field="interference", value=table)
        if self.tp < 1:
            raise SpecError("must be at least 1", field="tp", value=self.tp)
        if self.slots < 0:
            raise SpecError("must be >= 0", field="slots", value=self.slots)


@dataclasses.dataclass(frozen=True)
class Trajectory:
    trajectory_id: str
    predicted_length: float
    """Predicted tokens still to generate (or in total: the caller chooses, the DP only sorts)."""


@dataclasses.dataclass(frozen=True)
class Merge:
    """Fuse trajectories predicted shorter than ``below`` into blocks of ``block`` (sorted order)."""

    below: float
    block: int


@dataclasses.dataclass(frozen=True)
class Partition:
    """Contiguous split of the sorted items: worker ``j`` gets items ``ends[j-1]..ends[j]-1``."""

    ends: tuple[int, ...]
    makespan: float


@dataclasses.dataclass(frozen=True)
class Group:
    worker_id: str
    trajectory_ids: tuple[str, ...]
    cost: float
    """Predicted group time ``I(|G|) · t_base · L_max`` in seconds (0 for an empty worker)."""


@dataclasses.dataclass(frozen=True)
class Placement:
    groups: tuple[Group, ...]
    """One per worker, in worker order (descending TP); together they hold every trajectory."""
    makespan: float
    order: tuple[str, ...]
    """Trajectory ids by descending predicted length: the presorted rank (index 0 is the longest)."""

    def capacities(self) -> tuple[int, ...]:
        """Group sizes ``c_j``, the input of ``migration.scaled_capacities``."""
        return tuple(len(g.trajectory_ids) for g in self.groups)


def interference_from_step_times(step_times: Sequence[float], *, max_group: int) -> tuple[float, ...]:
    """The crude closed form of ``I``: ``t_step(min(s, B)) / t_step(1) · max(1, s / B)``.

    It assumes every member is as long as the head (an upper bound); ``interference_by_simulation``
    is the paper's method.

    ``step_times[b-1]`` is the decode step time at ``b`` running sequences and ``B = len(step_times)``
    the largest running batch; a group bigger than ``B`` runs in waves, so its head waits in
    proportion. The paper refines this with a profiler-driven simulation; any non-decreasing table
    can be passed to ``WorkerProfile`` instead.
    """
    if not step_times or any(t <= 0 for t in step_times):
        raise SpecError("needs at least one positive step time", field="step_times", value=step_times)
    if max_group < 1:
        raise SpecError("must be at least 1", field="max_group", value=max_group)
    base, cap = step_times[0], len(step_times)
    out: list[float] = []
    for s in range(1, max_group + 1):
        value = step_times[min(s, cap) - 1] / base * max(1.0, s / cap)
        out.append(max(value, out[-1]) if out else value)  # keep it monotone even if profiles are noisy
    return tuple(out)


def interference_by_simulation(
    step_times: Sequence[float], shape: Sequence[float], *, max_group: int, grid: int = 64
) -> tuple[float, ...]:
    """``I(s)`` from a fluid simulation of a group on one worker, the paper's profiler-driven method.

    A group of ``s`` takes ``s`` evenly spaced quantiles of ``shape`` (lengths relative to the
    group's longest, in ``(0, 1]``; e.g. the batch's predictions over their maximum). They decode in
    lockstep under continuous batching with at most ``B = len(step_times)`` running, longest first
    (progressive priority), each step costing ``step_times[running - 1]``; ``I(s)`` is the time the
    last one finishes over ``t_base``. It is simulated at ``grid`` sizes spread geometrically and
    interpolated linearly in between, then made monotone.
    """
    if not step_times or any(t <= 0 for t in step_times):
        raise SpecError("needs at least one positive step time", field="step_times", value=step_times)
    if not shape or any(not 0 < x <= 1 for x in shape):
        raise SpecError("needs relative lengths in (0, 1]", field="shape", value=len(shape))
    if max_group < 1 or grid < 2:
        raise SpecError("must be at least 1 (grid at least 2)", field="max_group", value=max_group)
    ordered = sorted(shape, reverse=True)
    sizes = sorted({max(1, round(max_group ** (k / (grid - 1)))) for k in range(grid)} | {1, max_group})
    simulated = {size: group_time(step_times, _quantiles(ordered, size)) / step_times[0] for size in sizes}
    out: list[float] = []
    for lo, hi in itertools.pairwise(sizes):
        for size in range(lo, hi):
            out.append(simulated[lo] + (simulated[hi] - simulated[lo]) * (size - lo) / (hi - lo))
    out.append(simulated[sizes[-1]])
    return tuple(itertools.accumulate(out[:max_group], max))


def _quantiles(ordered: Sequence[float], size: int) -> list[float]:
    """``size`` evenly spaced members of ``ordered`` (descending), the head first and scaled to 1."""
    picked = [ordered[min(len(ordered) - 1, i * len(ordered) // size)] for i in range(size)]
    return [x / picked[0] for x in picked]


def group_time(step_times: Sequence[float], lengths: Sequence[float]) -> float:
    """Fluid lockstep decode of ``lengths`` (descending) with ``len(step_times)`` slots, longest first."""
    cap = len(step_times)
    running = list(lengths[:cap])
    heapq.heapify(running)  # finishing positions on the shared token clock
    waiting = iter(lengths[cap:])
    clock = elapsed = 0.0
    while running:
        finish = running[0]
        elapsed += (finish - clock) * step_times[len(running) - 1]
        clock = finish
        while running and running[0] <= clock:
            heapq.heappop(running)
            nxt = next(waiting, None)
            if nxt is not None:
                heapq.heappush(running, clock + nxt)
    return elapsed


def plan(
    trajectories: Sequence[Trajectory],
    workers: Sequence[WorkerProfile],
    *,
    merge: Merge | None = None,
    exact_dp: bool = False,
) -> Placement:
    """Place a batch; ``exact_dp`` runs Eq. (3) itself instead of the (equal-valued) parametric search."""
    _check_trajectories(trajectories)
    ordered_workers = sort_workers(workers)
    # by id, then stably by descending length: the same order as the key (-length, id), cheaper
    ordered = sorted(sorted(trajectories, key=_ID), key=_LENGTH, reverse=True)
    items = _items(ordered, merge)
    lengths = [ordered[first].predicted_length for first, _ in items]
    counts = [count for _, count in items]
    totals = [math.fsum(t.predicted_length for t in ordered[first : first + count]) for first, count in items]
    optimum = (solve_dp if exact_dp else solve)(lengths, counts, ordered_workers, totals=totals).makespan
    part = balanced(optimum, lengths, counts, ordered_workers, totals=totals)
    costs = group_costs(part, lengths, counts, ordered_workers, totals=totals)
    groups: list[Group] = []
    start = 0
    for worker, end, cost in zip(ordered_workers, part.ends, costs, strict=True):
        first = items[start][0] if start < len(items) else len(ordered)
        last = items[end][0] if end < len(items) else len(ordered)
        ids = tuple(map(_ID, ordered[first:last]))
        groups.append(Group(worker_id=worker.worker_id, trajectory_ids=ids, cost=cost))
        start = end
    return Placement(groups=tuple(groups), makespan=part.makespan, order=tuple(map(_ID, ordered)))


_ID = operator.attrgetter("trajectory_id")
_LENGTH = operator.attrgetter("predicted_length")


def sort_workers(workers: Sequence[WorkerProfile]) -> list[WorkerProfile]:
    """Validate and order the workers: descending TP, then faster ``t_base``, then id."""
    if not workers:
        raise SpecError("at least one worker is needed", field="workers", value=[])
    ids = [w.worker_id for w in workers]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise SpecError(f"duplicate worker id {dup!r}", field="workers", value=dup)
    return sorted(workers, key=lambda w: (-w.tp, w.t_base, w.worker_id))


def solve(
    lengths: Sequence[float],
    counts: Sequence[int],
    workers: Sequence[WorkerProfile],
    *,
    totals: Sequence[float] | None = None,
) -> Partition:
    """Optimal contiguous partition of items (sorted descending) by parametric search; see module doc.

    ``totals``: each item's summed member lengths (a merged block's), priced by workers with
    ``slots``; by default every member is taken as long as the item's head.
    """
    items = grouping.Items.of(lengths, counts, totals)
    ends, covered, _, high = grouping.greedy(math.inf, items, workers)
    if not covered:
        raise SpecError(
            f"{items.prefix[-1]} trajectories exceed the workers' largest groups",
            field="workers",
            value=len(workers),
        )
    best = ends
    if not lengths:
        return Partition(ends=tuple(best), makespan=0.0)
    low = lengths[0] * min(w.t_base * w.interference[0] for w in workers)
    for _ in range(MAX_SEARCH_STEPS):
        if low >= high:
            break
        mid = (low + high) / 2
        ends, covered, next_event, makespan = grouping.greedy(mid, items, workers)
        if covered:
            high, best = makespan, ends
        else:
            low = next_event
    return Partition(ends=tuple(best), makespan=high)


def balanced(
    bound: float,
    lengths: Sequence[float],
    counts: Sequence[int],
    workers: Sequence[WorkerProfile],
    *,
    totals: Sequence[float] | None = None,
) -> Partition:
    """Among the partitions whose every group costs at most ``bound``, the one with the most even sizes.

    Eq. (2) fixes only the slowest group; with a long tail that is the longest trajectory alone and
    any split of the rest under it is "optimal", including one that packs everything onto the first
    few workers. We pick, worker by worker, an even share of the trajectories still unplaced, clamped
    to what fits under ``bound`` (the forward reach) and to what the later workers need taken off
    their hands (the backward greedy's minimal end), so feasibility is kept at every step.
    """
    items = grouping.Items.of(lengths, counts, totals)
    prefix = items.prefix
    n = len(lengths)
    lows = grouping.backward_lows(bound, items, workers)
    ends: list[int] = []
    start = 0
    makespan = 0.0
    for j, worker in enumerate(workers):
        reach = grouping.reach(bound, worker, items, start)
        share = -(-(prefix[n] - prefix[start]) // (len(workers) - j))
        even = bisect.bisect_right(prefix, prefix[start] + share, start, n + 1) - 1
        end = max(lows[j], min(reach, even))
        if end > start:
            makespan = max(makespan, items.cost(worker, start, end))
        ends.append(end)
        start = end
    if start < n:
        raise SpecError(f"no partition fits under {bound}", field="bound", value=bound)
    return Partition(ends=tuple(ends), makespan=makespan)


def group_costs(
    partition: Partition,
    lengths: Sequence[float],
    counts: Sequence[int],
    workers: Sequence[WorkerProfile],
    *,
    totals: Sequence[float] | None = None,
) -> list[float]:
    """Predicted time of every worker's group under ``partition`` (0 for an empty one)."""
    items = grouping.Items.of(lengths, counts, totals)
    out: list[float] = []
    start = 0
    for worker, end in zip(workers, partition.ends, strict=True):
        out.append(items.cost(worker, start, end) if end > start else 0.0)
        start = end
    return out


def solve_dp(
    lengths: Sequence[float],
    counts: Sequence[int],
    workers: Sequence[WorkerProfile],
    *,
    totals: Sequence[float] | None = None,
) -> Partition:
    """Eq. (3) with back-pointers, ``O(n · m · log n)``.

    ``D[k][j-1]`` grows with ``k`` and the new group's cost shrinks with ``k`` (a later head is
    shorter and the group smaller), so the best split sits where they cross: a binary search, not a
    scan over every ``k``.
    """
    items = grouping.Items.of(lengths, counts, totals)
    prefix = items.prefix
    n = len(lengths)
    previous = [0.0] + [math.inf] * n  # D[i][0]: nothing fits on zero workers
    splits: list[list[int]] = []
    for worker in workers:

        def group_cost(k: int, i: int, worker: WorkerProfile = worker) -> float:
            return 0.0 if k == i else items.cost(worker, k, i)

        current = [0.0] * (n + 1)
        back = [0] * (n + 1)
        for i in range(1, n + 1):
            lo, hi = 0, i  # smallest k in [0, i] with D[k] >= cost(k, i); cost(i, i) = 0 so it exists
            while lo < hi:
                mid = (lo + hi) // 2
                if previous[mid] >= group_cost(mid, i):
                    hi = mid
                else:
                    lo = mid + 1
            best_k, best = lo, max(previous[lo], group_cost(lo, i))
            if lo > 0:
                alt = max(previous[lo - 1], group_cost(lo - 1, i))
                if alt <= best:
                    best_k, best = lo - 1, alt
            current[i], back[i] = best, best_k
        splits.append(back)
        previous = current
    if math.isinf(previous[n]):
        raise SpecError(f"{prefix[-1]} trajectories exceed the workers' largest groups", field="workers")
    ends = [n]
    for back in reversed(splits[1:]):
        ends.append(back[ends[-1]])
    return Partition(ends=tuple(reversed(ends)), makespan=previous[n])


def _items(ordered: Sequence[Trajectory], merge: Merge | None) -> list[tuple[int, int]]:
    """(index of the first member, member count) per item, in sorted order."""
    if merge is None:
        return [(i, 1) for i in range(len(ordered))]
    if merge.block < 1:
        raise SpecError("must be at least 1", field="merge.block", value=merge.block)
    items: list[tuple[int, int]] = []
    i = 0
    while i < len(ordered):
        if ordered[i].predicted_length >= merge.below:
            items.append((i, 1))
            i += 1
        else:
            size = min(merge.block, len(ordered) - i)
            items.append((i, size))
            i += size
    return items


def _check_trajectories(trajectories: Sequence[Trajectory]) -> None:
    # one pass in C for the common, valid case; the slow scan only runs to name the bad entry
    ids = {t.trajectory_id for t in trajectories}
    lengths = [t.predicted_length for t in trajectories]
    if len(ids) == len(trajectories) and (not lengths or (min(lengths) >= 0 and math.isfinite(max(lengths)))):
        return
    seen: set[str] = set()
    for i, t in enumerate(trajectories):
        if t.trajectory_id in seen:
            raise SpecError(
                f"duplicate trajectory id {t.trajectory_id!r}",
                field=f"trajectories[{i}].trajectory_id",
                value=t.trajectory_id,
            )
        seen.add(t.trajectory_id)
        if not (t.predicted_length >= 0 and math.isfinite(t.predicted_length)):
            raise SpecError(
                "must be a finite number >= 0",
                field=f"trajectories[{i}].predicted_length",
                value=t.predicted_length,
            )
