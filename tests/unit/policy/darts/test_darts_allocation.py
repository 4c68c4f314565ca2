"""DARTS Alg. 1 (``treadle.policy.darts.allocate``): optimal against brute force, and its edges."""

from __future__ import annotations

import itertools
import random

import pytest

from treadle import errors
from treadle.policy import darts
from treadle.policy.darts import allocation

WEIGHTS = (0.0, 0.25, 0.5, 1.0)  # includes ties and the min-max zero


def _brute(weights: tuple[float, ...], total: int, low: int, high: int) -> float:
    """The least Eq. 5/10 objective over every feasible integer allocation."""
    pools = (p for p in itertools.product(range(low, high + 1), repeat=len(weights)) if sum(p) == total)
    return min(allocation.objective(weights, p) for p in pools)


def _instances() -> list[tuple[tuple[float, ...], int, int, int]]:
    """Every prompt count 1-6 and extra room 0-3, a seeded sample of weight vectors, every total."""
    rng = random.Random(15)
    out = []
    for n in range(1, 7):
        for room in range(4):
            vectors = {tuple(rng.choice(WEIGHTS) for _ in range(n)) for _ in range(6)}
            vectors.add(tuple(round(rng.random(), 3) for _ in range(n)))
            for weights in sorted(vectors):
                for total in range(n * 8, n * (8 + room) + 1):
                    out.append((weights, total, 8, 8 + room))
    return out


def test_allocate_equals_brute_force_on_every_tiny_instance() -> None:
    instances = _instances()
    assert len(instances) > 900
    for weights, total, low, high in instances:
        pools = darts.allocate(weights, total, low, high)
        assert sum(pools) == total and all(low <= p <= high for p in pools), (weights, total, high)
        best = _brute(weights, total, low, high)
        assert allocation.objective(weights, pools) == pytest.approx(best, abs=1e-12), (weights, total, high)


def test_every_weight_vector_of_three_prompts_matches_brute_force() -> None:
    """Exhaustive over a weight grid (ties everywhere), not just a sample."""
    for weights in itertools.product(WEIGHTS, repeat=3):
        for total in range(3 * 8, 3 * 11 + 1):
            pools = darts.allocate(weights, total, 8, 11)
            assert allocation.objective(weights, pools) == pytest.approx(_brute(weights, total, 8, 11))


@pytest.mark.parametrize(
    ("weights", "total", "expected"),
    [
        ((1.0, 1.0, 1.0), 26, [9, 9, 8]),  # uniform: spread evenly, ties to the lowest prompt
        ((0.0, 1.0, 0.5), 27, [8, 11, 8]),  # 1/72, 1/90, 1/110 all beat the other's .5/72
        ((0.0, 0.0, 1.0), 28, [8, 8, 12]),  # the weight-0 prompt gets nothing while another can take
        ((0.0, 0.0, 1.0), 34, [10, 8, 16]),  # ... and takes what is left once the others are full
    ],
    ids=["uniform", "weighted", "zero-starves", "zero-fills-last"],
)
def test_greedy_order(weights: tuple[float, ...], total: int, expected: list[int]) -> None:
    assert darts.allocate(weights, total, 8, 16) == expected


def test_bounds_and_full_budgets() -> None:
    assert darts.allocate([0.3, 0.9], 16, 8, 16) == [8, 8]
    assert darts.allocate([0.3, 0.9], 32, 8, 16) == [16, 16]
    assert darts.allocate([], 0, 8, 16) == []


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (([1.0], 7, 8, 16), "total"),
        (([1.0], 17, 8, 16), "total"),
        (([-1.0], 8, 8, 16), "weights"),
        (([float("nan")], 8, 8, 16), "weights"),
        (([1.0], 8, 8, 7), "high"),
        (([1.0], 0, 0, 4), "low"),
    ],
)
def test_bad_input_names_the_field(args: tuple[list[float], int, int, int], field: str) -> None:
    with pytest.raises(errors.SpecError) as info:
        darts.allocate(*args)
    assert info.value.field == field


def test_normalise_is_min_max_and_uniform_when_flat() -> None:
    assert darts.normalise([2.0, 4.0, 3.0]) == [0.0, 1.0, 0.5]
    assert darts.normalise([5.0, 5.0]) == [1.0, 1.0]
    assert darts.normalise([]) == []
