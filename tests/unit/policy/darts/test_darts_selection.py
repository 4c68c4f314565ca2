"""DARTS selection (``treadle.policy.darts.selection``): dual-end edges, the worked example, GRPO parity."""

from __future__ import annotations

import pytest

from treadle import errors
from treadle.policy import darts, grpo
from treadle.policy.darts import allocation, selection

T, F = True, False


@pytest.mark.parametrize(
    ("lengths", "truncated", "m", "k", "expected"),
    [
        # 7 shortest + the longest valid: index 9 (900 tokens) over truncated 10 and 11
        (list(range(100, 1300, 100)), [F] * 10 + [T, T], 8, 7, [0, 1, 2, 3, 4, 5, 6, 9]),
        # fewer than L valid beyond the K shortest: backfill with the shortest left (truncated)
        ([10, 20, 30, 40, 99, 99, 99, 99], [F, F, F, F, T, T, T, T], 4, 2, [0, 1, 2, 3]),
        ([10, 20, 99, 99, 99, 99], [F, F, T, T, T, T], 4, 2, [0, 1, 2, 3]),
        # a truncated candidate among the K shortest stays (it carries the overlong penalty)
        ([99, 99, 99, 99, 99, 50], [T, T, T, T, T, F], 3, 2, [0, 1, 5]),
        # ties: equal lengths go by pool index, for the short end and the long end alike
        ([5, 5, 5, 5, 9, 9, 9], [F] * 7, 4, 2, [0, 1, 4, 5]),
        # k = m is shortest-only; k = 0 is longest-valid-only
        ([30, 10, 20, 40], [F] * 4, 2, 2, [1, 2]),
        ([30, 10, 20, 40], [F, F, F, T], 2, 0, [0, 2]),
        # a pool of exactly m: everything, in pool order
        ([7, 3, 9], [F, T, F], 3, 2, [0, 1, 2]),
    ],
    ids=["7+1", "few-valid", "few-valid-2", "truncated-in-short", "ties", "k=m", "k=0", "pool=m"],
)
def test_select_dual_end(
    lengths: list[int], truncated: list[bool], m: int, k: int, expected: list[int]
) -> None:
    assert darts.select_dual_end(lengths, truncated, m, k) == expected


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (([1, 2], [F], 1, 1), "truncated"),
        (([1, 2], [F, F], 3, 1), "lengths"),
        (([1, 2], [F, F], 2, 3), "k"),
        (([1, 2], [F, F], 0, 0), "m"),
    ],
)
def test_selection_names_the_bad_field(args: tuple[list[int], list[bool], int, int], field: str) -> None:
    with pytest.raises(errors.SpecError) as info:
        darts.select_dual_end(*args)
    assert info.value.field == field


def test_saturated_prompts_switch_to_shortest_only_with_early_stop() -> None:
    assert selection.mode(16, 16) == selection.SHORTEST and selection.mode(15, 16) == selection.DUAL_END
    lengths, truncated = list(range(16, 0, -1)), [F] * 16
    assert selection.select(lengths, truncated, 8, 7, m_up=16) == list(range(8, 16))  # the 8 shortest
    assert selection.select(lengths[:15], truncated[:15], 8, 7, m_up=16) == [0, *range(8, 15)]
    assert not selection.enough_valid([F] * 7 + [T, T], 8)  # truncated completions are not valid
    assert selection.enough_valid([F] * 8, 8)


# The digest's worked example (§2.3): ±1 rewards, a pool of 16 whose lengths rise with the index,
# K = 7, L = 1; the "standard" group is every other sample.
STANDARD = list(range(0, 16, 2))
POOL = [100 * (i + 1) for i in range(16)]
PATTERN_I = [1, 1, 1, 1, 1, -1, 1, 1, -1, -1, -1, -1, -1, -1, -1, -1]  # short ones right
PATTERN_II = [-1, -1, -1, 1, -1, -1, -1, -1, -1, 1, 1, 1, 1, 1, 1, 1]  # long ones right


def _stats(rewards: list[int], members: list[int]) -> tuple[float, float]:
    rs = [rewards[i] for i in members]
    mean = sum(rs) / len(rs)
    return mean, (sum((r - mean) ** 2 for r in rs) / len(rs)) ** 0.5


def test_worked_example_pattern_i_suppresses_and_amplifies() -> None:
    dual = darts.select_dual_end(POOL, [F] * 16, 8, 7)
    assert dual == [0, 1, 2, 3, 4, 5, 6, 15]
    assert _stats(PATTERN_I, STANDARD) == pytest.approx((0.0, 1.0))
    assert _stats(PATTERN_I, dual) == pytest.approx((0.5, 0.866), abs=1e-3)
    std_adv = selection.group_advantages(PATTERN_I, STANDARD)
    assert {round(a, 2) for a in std_adv} == {1.0, -1.0}
    adv = dict(zip(dual, selection.group_advantages(PATTERN_I, dual), strict=True))
    assert adv[15] == pytest.approx(-1.732, abs=1e-3)  # the incorrect long tail: amplified
    assert adv[0] == pytest.approx(0.577, abs=1e-3)  # what a correct member (long or not) gets: suppressed


def test_worked_example_pattern_ii_boosts_the_valid_long_answer() -> None:
    dual = darts.select_dual_end(POOL, [F] * 16, 8, 7)
    assert _stats(PATTERN_II, STANDARD) == pytest.approx((-0.25, 0.968), abs=1e-3)
    assert _stats(PATTERN_II, dual) == pytest.approx((-0.5, 0.866), abs=1e-3)
    std_adv = dict(zip(STANDARD, selection.group_advantages(PATTERN_II, STANDARD), strict=True))
    assert std_adv[14] == pytest.approx(1.291, abs=1e-3)
    adv = dict(zip(dual, selection.group_advantages(PATTERN_II, dual), strict=True))
    assert adv[15] == pytest.approx(1.732, abs=1e-3)  # boosted


@pytest.mark.parametrize("m_up", [8, 16], ids=["dual-end-path", "saturated-path"])
def test_total_n_times_m_reproduces_standard_grpo(m_up: int) -> None:
    """Budget N·M -> every pool is M -> every group is the whole pool -> the trainer's advantages."""
    n, m = 5, 8
    lengths = [[(37 * p + 11 * j) % 50 + 1 for j in range(m)] for p in range(n)]
    truncated = [[j == p for j in range(m)] for p in range(n)]
    rewards = [[float((p * j + j) % 3 == 0) for j in range(m)] for p in range(n)]
    weights = allocation.normalise([float(p) for p in range(n)])
    pools = darts.allocate(weights, n * m, m, m_up)
    assert pools == [m] * n
    groups = [
        selection.select(lengths[p][: pools[p]], truncated[p][: pools[p]], m, 7, m_up=m_up) for p in range(n)
    ]
    assert groups == [list(range(m))] * n
    ours = [a for p in range(n) for a in selection.group_advantages(rewards[p], groups[p])]
    flat = [r for rs in rewards for r in rs]
    standard = grpo.group_advantages(flat, [f"g{p}" for p in range(n) for _ in range(m)])
    assert ours == standard
