"""Alg. 3 (topology-agnostic DPArrange) and its DP operators: flat units and GPU chunks (Alg. 4).

DPArrange gives each of the candidates ``c_1 .. c_m`` (all start now) an amount ``k_i`` of its
feasible set minimising ``Σ T_i(k_i)``: their exact ACT sum. The recurrence is the paper's,

    dp[i][j] = min over k ∈ S_i of dp[i-1][Prev(j, k)] + T_i(k),   dp[0][start] = 0,

over operator states ``j`` that stand for "what the first ``i`` candidates were granted":

* ``FlatOperator`` (CPU cores of a node, API concurrency: the paper's Basic DP Operator): ``j`` is
  the number of units granted, ``Prev(j, k) = j - k``, valid while ``j <= free``.
* ``ChunkOperator`` (Alg. 4): ``j`` is the *multiset* of chunks granted, counts ``(c1, c2, c4, c8)``
  in the paper's mixed-radix order, ``Prev(j, k)`` removes one ``k``-chunk and ``IsValid(j)`` asks
  whether the multiset fits the free chunks with splitting allowed (``buddy.fits``). The printed
  ``Prev`` consumes only whole free chunks, largest first, and never splits (digest bug #8):
  a 1-GPU request on a node with one free 8-chunk was infeasible. Only valid states are enumerated.

Fixes to the printed listing: the optimum is the best state of the last row, not ``dp[m][n]``
(bug #7: with discrete sets such as {1, 2, 4, 8} exactly ``n`` units may be unreachable). And
because Alg. 1 evicts candidates from the *back*, row ``i`` of one table is already the optimum of
the prefix ``C[:i]``: ``Table.best(i)`` answers every eviction step from one DP pass, where the
listing re-runs DPArrange per step. Rows are numpy vectors, one gather per feasible amount.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Protocol

import numpy as np
import numpy.typing as npt

from treadle.policy.tangram import buddy, model

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


class Operator(Protocol):
    """Alg. 3's DP operator as index arrays; state 0 is "nothing granted"."""

    @property
    def states(self) -> int: ...

    def prev(self, k: int) -> IntArray:
        """Per state ``j``: the index of ``Prev(j, k)``, or ``states`` where it is not a valid state."""
        ...


@dataclasses.dataclass(frozen=True)
class FlatOperator:
    free: int

    @property
    def states(self) -> int:
        return self.free + 1

    def prev(self, k: int) -> IntArray:
        return _flat_prev(self.free, k)


@functools.lru_cache(maxsize=4096)
def _flat_prev(free: int, k: int) -> IntArray:
    j = np.arange(free + 1, dtype=np.int64) - k
    j[j < 0] = free + 1
    return j


@dataclasses.dataclass(frozen=True)
class ChunkOperator:
    free: buddy.Inventory
    """Free chunks per size (1, 2, 4, 8)."""
    reserved: buddy.Inventory = (0, 0, 0, 0)
    """Chunks already promised to candidates outside this DP (Alg. 1's other groups)."""
    most: int = 64
    """At most this many chunks are granted (one per candidate): bounds the state space."""

    @property
    def states(self) -> int:
        return len(_chunk_states(self.free, self.reserved, self.most)[0])

    def prev(self, k: int) -> IntArray:
        return _chunk_prev(self.free, self.reserved, self.most, buddy.level(k))


@functools.lru_cache(maxsize=256)
def _chunk_states(
    free: buddy.Inventory, reserved: buddy.Inventory, most: int
) -> tuple[list[buddy.Inventory], dict[buddy.Inventory, int]]:
    """Every valid granted multiset ``(c1, c2, c4, c8)``, ``(0, 0, 0, 0)`` first, and its index.

    Walks the sizes largest first, carrying the spare slots down (``buddy.fits``), so only valid
    multisets are visited.
    """
    states: list[buddy.Inventory] = []

    def walk(i: int, slots: int, chosen: tuple[int, ...], left: int) -> None:
        if i < 0:
            c8, c4, c2, c1 = chosen
            states.append((c1, c2, c4, c8))
            return
        slots = slots * (2 if i < 3 else 1) + free[i] - reserved[i]
        if slots < 0:  # the reserved chunks of this size no longer fit
            return
        for c in range(min(slots, left) + 1):
            walk(i - 1, slots - c, (*chosen, c), left - c)

    walk(3, 0, (), most)
    states.sort(key=lambda s: (s[3], s[2], s[1], s[0]))  # the paper's Encode order
    return states, {s: i for i, s in enumerate(states)}


@functools.lru_cache(maxsize=1024)
def _chunk_prev(free: buddy.Inventory, reserved: buddy.Inventory, most: int, k: int) -> IntArray:
    states, index = _chunk_states(free, reserved, most)
    i = buddy.SIZES.index(k)
    out = np.full(len(states), len(states), dtype=np.int64)
    for j, s in enumerate(states):
        if s[i] > 0:
            out[j] = index[(*s[:i], s[i] - 1, *s[i + 1 :])]  # type: ignore[index]
    return out


@dataclasses.dataclass(frozen=True)
class Table:
    """The DP rows of every prefix of the candidates (row ``i``: the first ``i``)."""

    tasks: Sequence[model.Action]
    rows: Sequence[FloatArray]
    choices: Sequence[IntArray]
    """``choices[i][j]``: index into ``tasks[i].options`` of the best amount for task ``i`` at state ``j``."""
    prevs: Sequence[IntArray]
    """``prevs[i]``: the ``Prev`` matrix of task ``i`` (one row per option)."""

    def best(self, count: int) -> tuple[float, tuple[int, ...]]:
        """The least ``Σ T_i`` of the first ``count`` tasks and their amounts (``inf, ()`` if none fits)."""
        row = self.rows[count]
        state = int(np.argmin(row))  # bug #7: the best state, not exactly n units
        value = float(row[state])
        if not np.isfinite(value):
            return value, ()
        amounts = []
        for i in range(count - 1, -1, -1):
            options = self.tasks[i].options
            c = self.choices[i].item(state) if len(options) > 1 else 0
            amounts.append(options[c])
            state = self.prevs[i].item(c, state)
        return value, tuple(reversed(amounts))


def arrange(op: Operator, tasks: Sequence[model.Action]) -> Table:
    """Alg. 3 over ``tasks`` in order (keys: their ``options`` and ``durations``)."""
    n = op.states
    row = np.full(n + 1, np.inf)  # the extra last cell is the "no valid predecessor" sentinel
    row[0] = 0.0
    rows, choices, prevs = [row[:n]], [], []
    columns = np.arange(n)
    first = np.zeros(n, dtype=np.int64)
    for task in tasks:
        prev = _prev_matrix(op, task.options)
        new = np.empty(n + 1)
        new[n] = np.inf
        if len(task.options) == 1:  # an inelastic candidate: a shift and a constant
            choice = first
            np.take(row, prev[0], out=new[:n])
            new[:n] += task.durations[0]
        else:
            costs = row[prev]
            costs += np.asarray(task.durations)[:, None]
            choice = costs.argmin(axis=0)
            new[:n] = costs[choice, columns]
        row = new
        rows.append(row[:n])
        choices.append(choice)
        prevs.append(prev)
    return Table(tasks, rows, choices, prevs)


def _prev_matrix(op: Operator, options: tuple[int, ...]) -> IntArray:
    if isinstance(op, FlatOperator):
        return _flat_matrix(op.free, options)
    return np.stack([op.prev(k) for k in options])


@functools.lru_cache(maxsize=4096)
def _flat_matrix(free: int, options: tuple[int, ...]) -> IntArray:
    return np.stack([_flat_prev(free, k) for k in options])
