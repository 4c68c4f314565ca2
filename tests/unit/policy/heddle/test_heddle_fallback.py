"""fallback.choose: the DP's contiguous plan unless the longest-first interleaving is predicted sooner."""

from __future__ import annotations

import pytest

from treadle.errors import SpecError
from treadle.policy import heddle_live
from treadle.policy.heddle import fallback, presorted_dp


def _trajectories(lengths: list[float]) -> list[presorted_dp.Trajectory]:
    return [presorted_dp.Trajectory(f"t{i}", x) for i, x in enumerate(lengths)]


def test_fluid_time_by_hand() -> None:
    # two members of 10 and 4 tokens, step 1 + 0.5 (b - 1): 4 tokens at 1.5, then 6 at 1.0 = 12
    worker = heddle_live.profiles(["w0"], max_group=2, per_extra=0.5)[0]
    assert fallback.fluid_time(worker, ["a", "b"], {"a": 10.0, "b": 4.0}) == pytest.approx(12.0)
    # one slot: they run one after the other at batch 1
    one_slot = heddle_live.profiles(["w0"], max_group=2, per_extra=0.5, slots=1)[0]
    assert fallback.fluid_time(one_slot, ["a", "b"], {"a": 10.0, "b": 4.0}) == pytest.approx(14.0)
    assert fallback.fluid_time(worker, [], {}) == 0.0


def test_lockstep_long_trajectories_are_split_not_stacked() -> None:
    # the live bench's shape: equally long trajectories, a middle band and many short ones; step
    # 1 + 0.1 (b - 1) at b running. Eq. 2's DP puts the four long and two middle on w0 (a contiguous
    # prefix): 50 tokens at 6 running (1.5) + 50 at 4 (1.3) = 140. Interleaved, each worker gets
    # 2 long, 2 middle, 10 short: 10 at 14 (2.3) + 40 at 4 (1.3) + 50 at 2 (1.1) = 23 + 52 + 55 = 130.
    lengths = [100.0] * 4 + [50.0] * 4 + [10.0] * 20
    workers = heddle_live.profiles(["w0", "w1"], max_group=len(lengths), per_extra=0.1)
    got = fallback.choose(_trajectories(lengths), workers)
    assert got.contiguous_s == pytest.approx(140.0)
    assert got.interleaved_s == pytest.approx(130.0)
    assert got.interleaved
    longs = {f"t{i}" for i in range(4)}
    assert [len(longs & set(g.trajectory_ids)) for g in got.placement.groups] == [2, 2]
    assert sorted(t for g in got.placement.groups for t in g.trajectory_ids) == sorted(
        f"t{i}" for i in range(len(lengths))
    )
    # the contiguous plan it refused stacks the four long ones on w0
    dp = presorted_dp.plan(_trajectories(lengths), workers)
    assert longs <= set(dp.groups[0].trajectory_ids)


def test_a_tie_keeps_the_dp() -> None:
    # the DP: four long alone on w0, 100 tokens at 4 running (1.3) = 130. Interleaved: 2 long + 20
    # short a worker, 10 tokens at 22 running (3.1) + 90 at 2 (1.1) = 31 + 99 = 130. A tie: the DP stays
    lengths = [100.0] * 4 + [10.0] * 40
    workers = heddle_live.profiles(["w0", "w1"], max_group=len(lengths), per_extra=0.1)
    got = fallback.choose(_trajectories(lengths), workers)
    assert got.contiguous_s == pytest.approx(130.0) and got.interleaved_s == pytest.approx(130.0)
    assert not got.interleaved


def test_equal_predictions_tie_and_keep_the_dp() -> None:
    # at a task's first admission every prediction is the same: both plans split evenly, the DP stays
    lengths = [50.0] * 8
    workers = heddle_live.profiles(["w0", "w1"], max_group=8, per_extra=0.05)
    got = fallback.choose(_trajectories(lengths), workers)
    assert not got.interleaved
    assert got.contiguous_s == pytest.approx(got.interleaved_s)
    assert got.placement == presorted_dp.plan(_trajectories(lengths), workers)


def test_one_dominant_trajectory_keeps_the_dp_when_it_is_better() -> None:
    # one long trajectory alone on w0 and the rest on w1 is the DP's plan; LPT puts the long one
    # with nothing else too, so they tie at the long one's time alone: the DP is kept
    lengths = [1000.0, 10.0, 10.0, 10.0]
    workers = heddle_live.profiles(["w0", "w1"], max_group=4, per_extra=0.1)
    got = fallback.choose(_trajectories(lengths), workers)
    assert got.contiguous_s == pytest.approx(1000.0)
    assert not got.interleaved


def test_never_worse_than_the_dp_by_its_own_model() -> None:
    for per_extra in (0.0, 0.05, 0.3):
        for lengths in (
            [5.0, 4.0, 3.0, 2.0, 1.0],
            [9.0, 9.0, 9.0, 1.0, 1.0, 1.0, 1.0],
            [7.0] * 3 + [2.0] * 9,
        ):
            workers = heddle_live.profiles(["a", "b", "c"], max_group=len(lengths), per_extra=per_extra)
            got = fallback.choose(_trajectories(lengths), workers)
            assert max(g.cost for g in got.placement.groups) <= got.contiguous_s + 1e-9


def test_a_table_shorter_than_the_batch_names_the_field() -> None:
    worker = presorted_dp.WorkerProfile("w0", t_base=1.0, interference=(1.0,))
    with pytest.raises(SpecError) as err:
        fallback.fluid_time(worker, ["a", "b"], {"a": 1.0, "b": 1.0})
    assert err.value.field == "interference"


def test_live_placement_with_an_interleaved_plan_does_not_migrate() -> None:
    predictions = {f"t{i}": x for i, x in enumerate([100.0] * 4 + [50.0] * 4 + [10.0] * 20)}
    live = heddle_live.place(heddle_live.Live(), predictions, ["w0", "w1"], per_extra=0.1)
    assert live.interleaved
    assert live.router is not None
    before = live.router.entries["t0"].worker_id
    # t0 now predicted shortest: a rank-interval plan would move it, the interleaved one keeps it
    for _ in range(5):
        live, move = heddle_live.on_step(live, "t0", predicted_remaining=0.0, context_tokens=500)
        assert move is None
    assert heddle_live.route(live, "t0")[1] == before
    assert live.router is not None and live.router.entries["t0"].predicted_remaining == 0.0
