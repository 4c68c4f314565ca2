"""A contiguous group's predicted time on a worker, and how far a group reaches under a time bound.

The primitives that ``presorted_dp``'s three searches (``solve``, ``balanced``, ``solve_dp``) share;
its module docstring gives the model (Eq. 2, and our slots term) and why the searches are exact.
Items are the sorted trajectories after short-trajectory merging: ``Items`` holds their heads and
running sums, and a group is the items ``start..end-1``.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import math
from collections.abc import Sequence
from typing import Protocol


class Worker(Protocol):
    """What a group's cost reads of a worker: ``presorted_dp.Worker`` (a protocol, so that this
    module need not import the one that calls it)."""

    @property
    def t_base(self) -> float: ...
    @property
    def interference(self) -> tuple[float, ...]: ...
    @property
    def slots(self) -> int: ...


def greedy(bound: float, items: Items, workers: Sequence[Worker]) -> tuple[list[int], bool, float, float]:
    """Fill workers in order under ``bound``: (ends, all placed, next candidate bound, makespan)."""
    n = len(items.lengths)
    prefix = items.prefix
    start = 0
    ends: list[int] = []
    next_event = math.inf
    makespan = 0.0
    for worker in workers:
        end = reach(bound, worker, items, start)
        if start < n:
            if end < n and prefix[end + 1] - prefix[start] <= len(worker.interference):
                # the bound at which this worker could take one more item
                next_event = min(next_event, items.cost(worker, start, end + 1))
            if end > start:
                makespan = max(makespan, items.cost(worker, start, end))
        ends.append(end)
        start = end
    return ends, start >= n, next_event, makespan


def reach(bound: float, worker: Worker, items: Items, start: int) -> int:
    """The furthest item end a group starting at ``start`` on ``worker`` reaches under ``bound``."""
    lengths, prefix = items.lengths, items.prefix
    n = len(lengths)
    if start >= n:
        return n
    table = worker.interference
    head = lengths[start] * worker.t_base
    # sizes whose head term fits: I(min(s, c)) · head <= bound, so every size once I(c) · head does
    running = min(worker.slots, len(table)) if worker.slots else len(table)
    if head <= 0:
        fit = running
    else:
        fit = bisect.bisect_right(table, bound / head, 0, running)
        # the division can round either way; settle the boundary with the product itself
        while fit < running and head * table[fit] <= bound:
            fit += 1
        while fit > 0 and head * table[fit - 1] > bound:
            fit -= 1
    if fit < running:
        return bisect.bisect_right(prefix, prefix[start] + fit, start, n + 1) - 1
    end = bisect.bisect_right(prefix, prefix[start] + len(table), start, n + 1) - 1
    if 0 < worker.slots < len(table) and end > start:
        # and the waves term: I(c) · t_base · total / c <= bound
        per_slot = bound * worker.slots / (table[running - 1] * worker.t_base)
        end = min(
            end, max(start, bisect.bisect_right(items.sums, items.sums[start] + per_slot, start, n + 1) - 1)
        )
        while end > start and items.cost(worker, start, end) > bound:
            end -= 1
        while (
            end < n
            and prefix[end + 1] - prefix[start] <= len(table)
            and items.cost(worker, start, end + 1) <= bound
        ):
            end += 1
    return end


def backward_lows(bound: float, items: Items, workers: Sequence[Worker]) -> list[int]:
    """``lows[j]``: the smallest end of worker ``j`` that leaves the rest coverable by workers ``j+1..``."""
    n = len(items.lengths)
    lows = [n] * len(workers)
    end = n
    for j in range(len(workers) - 1, 0, -1):
        worker = workers[j]
        lo, hi = 0, end  # smallest start a with cost(a, end) <= bound; cost falls as a grows
        while lo < hi:
            mid = (lo + hi) // 2
            if items.cost(worker, mid, end) <= bound:
                hi = mid
            else:
                lo = mid + 1
        end = lo
        lows[j - 1] = end
    return lows


@dataclasses.dataclass(frozen=True)
class Items:
    """The sorted items with running sums: member counts and summed member lengths."""

    lengths: Sequence[float]
    """Each item's head (longest member) length."""
    prefix: list[int]
    sums: list[float]

    @staticmethod
    def of(lengths: Sequence[float], counts: Sequence[int], totals: Sequence[float] | None) -> Items:
        if totals is None:
            totals = [x * c for x, c in zip(lengths, counts, strict=True)]
        prefix = list(itertools.accumulate(counts, initial=0))
        return Items(lengths, prefix, list(itertools.accumulate(totals, initial=0.0)))

    def cost(self, worker: Worker, start: int, end: int) -> float:
        """Predicted time of items ``start..end-1`` (at least one) as one group on ``worker``."""
        size = self.prefix[end] - self.prefix[start]
        return cost(worker, self.lengths[start], size, self.sums[end] - self.sums[start])


def cost(worker: Worker, head_length: float, size: int, total_length: float) -> float:
    """``I(s) · t_base · L_head``; past ``c`` slots ``I(c) · t_base · max(L_head, ΣL / c)``.

    Why, in ``presorted_dp``'s module docstring."""
    table = worker.interference
    if size > len(table):
        return math.inf
    c = worker.slots
    if c and size > c:
        return worker.t_base * table[c - 1] * max(head_length, total_length / c)
    return head_length * worker.t_base * table[size - 1]
