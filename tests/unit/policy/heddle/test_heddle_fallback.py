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


def test_a_batch_whose_dp_plan_loses_falls_back_to_the_per_turn_policy() -> None:
    predictions = {f"t{i}": x for i, x in enumerate([100.0] * 4 + [50.0] * 4 + [10.0] * 20)}
    live = heddle_live.place(heddle_live.Live(), predictions, ["w0", "w1"], per_extra=0.1)
    assert live.fallen_back and live.router is not None
    # no turn is routed (the caller's sticky least-loaded places it), none migrates, predictions
    # are still recorded
    assert heddle_live.route(live, "t0") == (live, None, False)
    for _ in range(5):
        live, move = heddle_live.on_step(live, "t0", predicted_remaining=0.0, context_tokens=500)
        assert move is None
    assert live.router is not None and live.router.entries["t0"].predicted_remaining == 0.0
    # a batch admitted while these are in flight falls back too; once they are done, the next is
    # planned afresh (equal predictions: a tie, the DP routes it)
    assert heddle_live.place(live, {"new": 50.0}, ["w0", "w1"], per_extra=0.1) is live
    for tid in predictions:
        live = heddle_live.finish(live, tid)
    fresh = heddle_live.place(live, {"a": 50.0, "b": 50.0}, ["w0", "w1"], per_extra=0.1)
    assert not fresh.fallen_back and heddle_live.route(fresh, "a")[1] == "w0"


def test_a_global_gate_prices_the_crowded_worker_as_queuing() -> None:
    # 2 long of 100 tokens and 40 short of 10, step 1 + 0.1 (b - 1). The DP gives the long pair w0
    # (100 at 2 running: 110) and the 40 short w1. Interleaved, each worker gets a long one and 20
    # short ones.
    lengths = [100.0] * 2 + [10.0] * 40
    workers = heddle_live.profiles(["w0", "w1"], max_group=len(lengths), per_extra=0.1)
    dp = presorted_dp.plan(_trajectories(lengths), workers)
    assert [len(g.trajectory_ids) for g in dp.groups] == [2, 40]
    # no gate: w1 runs its 40 at once, 10 tokens at 4.9 = 49; interleaved: 10 at 21 running (3.0)
    # + the long one's last 90 alone = 120. The DP's 110 wins.
    free = fallback.choose(_trajectories(lengths), workers)
    assert (free.contiguous_s, free.interleaved_s, free.interleaved) == (pytest.approx(110.0), 120.0, False)
    # a gate of 4: w1 runs 4 at a time, 400 tokens / 4 at 1.3 = 130; interleaved, the long one and 3
    # short run: 200 short tokens over 3 slots, 66.7 steps at 1.3 = 86.7, then the long one's last
    # 33.3 alone = 120. The interleaving wins.
    gated = fallback.choose(_trajectories(lengths), workers, gate=4)
    assert gated.contiguous_s == pytest.approx(130.0) and gated.interleaved_s == pytest.approx(120.0)
    assert gated.interleaved
    # a gate of 8 is wide enough for the DP again: w1 400 / 8 at 1.7 = 85, the long pair's 110 wins
    assert not fallback.choose(_trajectories(lengths), workers, gate=8).interleaved
    with pytest.raises(SpecError) as err:
        fallback.choose(_trajectories(lengths), workers, gate=-1)
    assert err.value.field == "gate"


def test_a_replan_that_prefers_the_interleaving_falls_back() -> None:
    # equal predictions at admission: the DP's even split. Then two turn out long and forty short:
    # under a gate of 4 the re-planned DP (the long pair alone, the rest on one worker) is priced
    # worse than the interleaving, so the task falls back: nothing moves, no turn is routed.
    outcomes = {}
    for gate in (0, 4):
        live = heddle_live.place(
            heddle_live.Live(), {f"t{i}": 30.0 for i in range(42)}, ["w0", "w1"], per_extra=0.1, gate=gate
        )
        assert not live.fallen_back and live.router is not None
        before = {tid: e.worker_id for tid, e in live.router.entries.items()}
        moves = 0
        for k in range(42):
            live, move = heddle_live.on_step(
                live, f"t{k}", predicted_remaining=100.0 if k < 2 else 10.0, context_tokens=200,
                per_extra=0.1, gate=gate,
            )  # fmt: skip
            moves += move is not None
        assert live.router is not None
        assert live.router.entries["t41"].predicted_remaining == 10.0  # recorded either way
        outcomes[gate] = (live.fallen_back, moves, heddle_live.route(live, "t0")[1])
        if gate:
            assert outcomes[gate] == (True, 0, None)
            assert {t: e.worker_id for t, e in live.router.entries.items()} == before
    assert outcomes[0][0] is False  # without the gate the DP's plan holds and migration goes on
