"""Slot-aware Heddle placement: a worker's group larger than its gate slots is priced in waves."""

from __future__ import annotations

import pytest

from treadle import errors
from treadle.policy import heddle_live
from treadle.policy.heddle import presorted_dp


def plan(lengths: list[float], *, slots: int) -> presorted_dp.Placement:
    trajectories = [presorted_dp.Trajectory(f"t{i}", length) for i, length in enumerate(lengths)]
    workers = heddle_live.profiles(["w0", "w1"], max_group=len(trajectories), slots=slots)
    return presorted_dp.plan(trajectories, workers)


def test_table_is_interference_of_the_running_slots_times_waves() -> None:
    (profile,) = heddle_live.profiles(["w"], max_group=4, per_extra=0.1, slots=2)
    # s = 1, 2 run at once: I(1), I(2); s = 3, 4 run in 1.5 and 2 waves of I(2) = 1.1
    assert profile.interference == pytest.approx((1.0, 1.1, 1.65, 2.2))
    (unlimited,) = heddle_live.profiles(["w"], max_group=4, per_extra=0.1)
    assert unlimited.interference == pytest.approx((1.0, 1.1, 1.2, 1.3))  # the paper's I(s), as before


def test_a_group_queued_behind_scarce_slots_is_not_priced_as_one_batch() -> None:
    lengths = [10.0, 6.0, 6.0, 6.0, 6.0, 6.0]
    # Slot-blind: {10} alone costs 10, the five 6s as one batch 6 · I(5) = 7.2, so w1 takes all five
    # (makespan 10) though with 2 slots they run in 2.5 waves of 6 · I(2) = 6.3 each (15.75).
    assert plan(lengths, slots=heddle_live.UNLIMITED).capacities() == (1, 5)
    # With 2 slots per worker: {10, 6} costs 10 · 1.05 = 10.5, the four 6s 6 · 1.05 · 2 = 12.6, better
    # than (1, 5) at 15.75 or (3, 3) at 10 · 1.05 · 1.5 = 15.75.
    placed = plan(lengths, slots=2)
    assert placed.capacities() == (2, 4)
    assert placed.makespan == pytest.approx(12.6)


def test_negative_slots_name_the_field() -> None:
    with pytest.raises(errors.SpecError) as err:
        heddle_live.profiles(["w"], max_group=2, slots=-1)
    assert err.value.field == "slots"
