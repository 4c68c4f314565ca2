"""Slot-aware Heddle placement: a worker's group larger than its gate slots is priced by its total work."""

from __future__ import annotations

import pytest

from treadle import errors
from treadle.policy import heddle_live
from treadle.policy.heddle import presorted_dp


def plan(lengths: list[float], *, slots: int) -> presorted_dp.Placement:
    trajectories = [presorted_dp.Trajectory(f"t{i}", length) for i, length in enumerate(lengths)]
    workers = heddle_live.profiles(["w0", "w1"], max_group=len(trajectories), slots=slots)
    return presorted_dp.plan(trajectories, workers)


def test_profiles_carry_the_slots_beside_the_papers_table() -> None:
    (profile,) = heddle_live.profiles(["w"], max_group=4, per_extra=0.1, slots=2)
    assert profile.interference == pytest.approx((1.0, 1.1, 1.2, 1.3))  # the paper's I(s)
    assert profile.slots == 2
    (unlimited,) = heddle_live.profiles(["w"], max_group=4, per_extra=0.1)
    assert unlimited.interference == profile.interference and unlimited.slots == 0


def test_a_group_queued_behind_scarce_slots_is_not_priced_as_one_batch() -> None:
    lengths = [10.0, 6.0, 6.0, 6.0, 6.0, 6.0]
    # Slot-blind: {10} alone costs 10, the five 6s as one batch 6 · I(5) = 7.2, so w1 takes all five.
    assert plan(lengths, slots=heddle_live.UNLIMITED).capacities() == (1, 5)
    # With 2 slots, I(2) = 1.05: (1, 5) costs 1.05 · max(6, 30 / 2) = 15.75 on w1; (2, 4) 10.5 and
    # 1.05 · max(6, 24 / 2) = 12.6; (3, 3) 1.05 · max(10, 22 / 2) = 11.55 and 1.05 · max(6, 18 / 2)
    # = 9.45; (4, 2) 1.05 · max(10, 28 / 2) = 14.7. The waves price (s / c waves of the head) chose
    # (2, 4): it charged {10, 6, 6} 1.5 waves of 10.
    placed = plan(lengths, slots=2)
    assert placed.capacities() == (3, 3)
    assert placed.makespan == pytest.approx(11.55)


def test_negative_slots_name_the_field() -> None:
    with pytest.raises(errors.SpecError) as err:
        heddle_live.profiles(["w"], max_group=2, slots=-1)
    assert err.value.field == "slots"
