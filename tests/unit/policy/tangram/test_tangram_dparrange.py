"""Alg. 3 (flat operator) and Alg. 4 (GPU chunks) equal brute force on tiny instances."""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Sequence

import pytest

from treadle.policy.tangram import buddy, dparrange, model, pools


def _action(i: int, options: Sequence[int], t_ori: float, serial: float) -> model.Action:
    top = max(options)
    eff = model.Elasticity(tuple(1.0 / (serial * m + (1 - serial)) for m in range(1, top + 1)))
    return model.Action(f"a{i}", "r", {"r": tuple(options)}, t_ori, eff)


def _flat_brute(free: int, tasks: Sequence[model.Action], count: int) -> float:
    best = math.inf
    for ks in itertools.product(*(t.options for t in tasks[:count])):
        if sum(ks) <= free:
            best = min(best, sum(t.duration(k) for t, k in zip(tasks, ks, strict=False)))
    return best


def _place(free: set[tuple[int, int]], sizes: Sequence[int]) -> bool:
    """Whether aligned chunks of ``sizes`` can be placed on the free (node, gpu) cells: exhaustive."""
    if not sizes:
        return True
    size, rest = sizes[0], sizes[1:]
    nodes = {n for n, _ in free}
    for node in sorted(nodes):
        for start in range(0, buddy.NODE_GPUS, size):
            cells = {(node, g) for g in range(start, start + size)}
            if cells <= free and _place(free - cells, rest):
                return True
    return False


def _gpu_brute(free: set[tuple[int, int]], tasks: Sequence[model.Action], count: int) -> float:
    best = math.inf
    for ks in itertools.product(*(t.options for t in tasks[:count])):
        if _place(free, sorted(ks, reverse=True)):
            best = min(best, sum(t.duration(k) for t, k in zip(tasks, ks, strict=False)))
    return best


@pytest.mark.parametrize("seed", range(40))
def test_flat_dp_equals_brute_force_on_every_prefix(seed: int) -> None:
    rng = random.Random(seed)
    free = rng.randint(3, 12)
    tasks = []
    for i in range(rng.randint(1, 4)):
        lo = rng.randint(1, 2)
        options = sorted(rng.sample(range(lo, 9), rng.randint(1, 4)))
        tasks.append(_action(i, options, rng.uniform(1, 50), rng.uniform(0, 0.6)))
    table = dparrange.arrange(dparrange.FlatOperator(free), tasks)
    for count in range(len(tasks) + 1):
        value, amounts = table.best(count)
        expect = _flat_brute(free, tasks, count)
        assert value == pytest.approx(expect)
        if math.isfinite(expect):  # the allocation is feasible and costs what the DP says
            assert sum(amounts) <= free and all(k in t.options for t, k in zip(tasks, amounts, strict=False))
            assert sum(t.duration(k) for t, k in zip(tasks, amounts, strict=False)) == pytest.approx(value)


def _random_gpu_pool(rng: random.Random) -> buddy.Pool:
    pool = buddy.empty(rng.randint(1, 2), 80.0)
    for _ in range(rng.randint(0, 4)):  # fragment it with a few grants
        got = buddy.allocate(pool, rng.choice(buddy.SIZES[:3]), "x", 1.0)
        if got is not None:
            pool = got[0]
    return pool


@pytest.mark.parametrize("seed", range(40))
def test_chunk_dp_equals_brute_force_over_real_gpu_positions(seed: int) -> None:
    rng = random.Random(seed)
    pool = _random_gpu_pool(rng)
    free_cells = {(c.node, g) for c in pool.free for g in range(c.start, c.end)}
    tasks = [
        _action(
            i, sorted(rng.sample(buddy.SIZES, rng.randint(1, 4))), rng.uniform(1, 50), rng.uniform(0, 0.5)
        )
        for i in range(rng.randint(1, 4))
    ]
    op = pools.ChunkPool(buddy.inventory(pool), 8 * pool.nodes).operator((0, 0, 0, 0), len(tasks))
    table = dparrange.arrange(op, tasks)
    for count in range(len(tasks) + 1):
        value, amounts = table.best(count)
        expect = _gpu_brute(free_cells, tasks, count)
        assert value == pytest.approx(expect)
        if math.isfinite(expect):
            assert _place(free_cells, sorted(amounts, reverse=True))


def test_discrete_sets_need_not_fill_every_unit() -> None:
    """Bug #7: with {2, 4} and 7 free units the optimum leaves one idle (dp[m][n] would be inf)."""
    tasks = [_action(0, (2, 4), 8.0, 0.0), _action(1, (2,), 8.0, 0.0)]
    value, amounts = dparrange.arrange(dparrange.FlatOperator(7), tasks).best(2)
    assert amounts == (4, 2) and value == pytest.approx(2.0 + 4.0)


def test_a_one_gpu_request_splits_a_whole_node() -> None:
    """Bug #8: the printed Prev never splits, so 1 GPU on a free 8-chunk node was infeasible."""
    op = pools.ChunkPool((0, 0, 0, 1), 8).operator((0, 0, 0, 0), 3)
    value, amounts = dparrange.arrange(op, [_action(i, (1,), 1.0, 0.0) for i in range(3)]).best(3)
    assert amounts == (1, 1, 1) and value == pytest.approx(3.0)
