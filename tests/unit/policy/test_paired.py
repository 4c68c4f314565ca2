"""The paired ratio interval the live Heddle benches print (hand-checked values)."""

from __future__ import annotations

import math

import pytest

from treadle.errors import SpecError
from treadle.policy import paired


@pytest.mark.parametrize(
    ("df", "expected"), [(1, 12.7062), (2, 4.3027), (5, 2.5706), (10, 2.2281), (30, 2.0423)]
)
def test_t_quantile_matches_the_table(df: int, expected: float) -> None:
    assert paired.t_quantile(0.975, df) == pytest.approx(expected, abs=2e-4)


def test_interval_of_three_rounds_by_hand() -> None:
    # log ratios ln(1.1), ln(1.2), ln(1.0); mean m, sd s, half-width 4.3027 * s / sqrt(3)
    got = paired.ratio_interval([11.0, 12.0, 10.0], [10.0, 10.0, 10.0])
    logs = [math.log(1.1), math.log(1.2), 0.0]
    m = sum(logs) / 3
    s = math.sqrt(sum((x - m) ** 2 for x in logs) / 2)
    assert got.ratio == pytest.approx(math.exp(m))
    assert got.low == pytest.approx(math.exp(m - 4.3027 * s / math.sqrt(3)), rel=1e-4)
    assert got.high == pytest.approx(math.exp(m + 4.3027 * s / math.sqrt(3)), rel=1e-4)
    assert got.rounds == 3
    assert not got.excludes_one()  # 1.0 round pulls the lower end below 1
    assert "3 rounds" in str(got)


def test_a_consistent_speedup_excludes_one_and_its_mirror_is_the_reciprocal() -> None:
    base, cand = [10.0, 10.4, 9.8, 10.1], [8.0, 8.1, 7.9, 8.2]
    faster = paired.ratio_interval(base, cand)
    slower = paired.ratio_interval(cand, base)
    assert faster.excludes_one() and faster.low > 1.0
    assert slower.high < 1.0
    assert slower.ratio == pytest.approx(1 / faster.ratio)
    assert slower.low == pytest.approx(1 / faster.high)


def test_pairing_removes_load_drift_between_rounds() -> None:
    # the machine slows 3x between rounds; within a round the candidate is always 10 % faster
    got = paired.ratio_interval([10.0, 30.0, 20.0], [10.0 / 1.1, 30.0 / 1.1, 20.0 / 1.1])
    assert got.low == pytest.approx(1.1) and got.high == pytest.approx(1.1)


def test_one_round_has_no_interval() -> None:
    got = paired.ratio_interval([10.0], [8.0])
    assert got.ratio == pytest.approx(1.25) and math.isnan(got.low) and not got.excludes_one()


@pytest.mark.parametrize(
    ("base", "cand", "field"),
    [([1.0, 2.0], [1.0], "candidate_s"), ([], [], "baseline_s"), ([1.0], [0.0], "baseline_s")],
)
def test_bad_input_names_the_field(base: list[float], cand: list[float], field: str) -> None:
    with pytest.raises(SpecError) as err:
        paired.ratio_interval(base, cand)
    assert err.value.field == field
