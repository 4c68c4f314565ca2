"""Router state: placement -> routes, step-boundary predictions -> views and migrations, finish."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from treadle.errors import NotFound, SpecError
from treadle.policy.heddle import migration, presorted_dp, router

TABLE = (1.0, 1.5, 2.0, 2.5, 3.0, 3.5)
PRED = {"a": 1000.0, "b": 400.0, "c": 300.0, "d": 200.0, "e": 100.0, "f": 50.0}


def placed_state() -> router.RouterState:
    workers = [presorted_dp.WorkerProfile(w, 1.0, TABLE) for w in ("w0", "w1")]
    trajs = [presorted_dp.Trajectory(t, p) for t, p in PRED.items()]
    return router.from_placement(presorted_dp.plan(trajs, workers), PRED)


def test_placement_becomes_routes_and_ranks() -> None:
    state = placed_state()
    # {a} | {b..f}: max(1000 · I(1), 400 · I(5) = 1200) = 1200 beats {a, b} | {c..f} = 1500
    assert state.capacities == (1, 5)
    assert router.route(state, "a") == "w0"
    assert [(v.trajectory_id, v.rank) for v in router.view(state)] == [
        ("a", 0),
        ("b", 1),
        ("c", 2),
        ("d", 3),
        ("e", 4),
        ("f", 5),
    ]


def test_misclassified_tail_migrates_during_its_tool_call() -> None:
    state = placed_state()
    start = router.route(state, "f")
    assert start == "w1"
    # f turns out to be the longest, but it is generating: stays
    state, move = router.on_step(state, "f", predicted_remaining=5000, context_tokens=800, in_tool_call=False)
    assert move is None
    assert router.route(state, "f") == "w1"
    assert router.view(state)[0].trajectory_id == "f"  # its rank is current already
    # at its next tool call it moves to the first group's worker, and the route follows at once
    state, move = router.on_step(
        state, "f", predicted_remaining=5000, context_tokens=800, in_tool_call=True, expected_tool_seconds=2.0
    )
    assert move is not None
    assert (move.source, move.target) == ("w1", "w0")
    assert move.exposed_seconds == 0.0  # 0.05 + 800 / 20k = 0.09 s hides in a 2 s tool call
    assert router.route(state, "f") == "w0"
    state, pending = router.take_pending(state)
    assert pending == (move,)
    assert state.pending == ()
    assert migration.schedule_epoch(pending) == (move,)


def test_finish_forgets_and_rescales() -> None:
    state = placed_state()
    for t in ("a", "b", "c", "d"):
        state = router.finish(state, t)
    assert sorted(state.entries) == ["e", "f"]
    # two left: capacities (1, 5) scale to 1/3 and 5/3, rounded (0, 2): both stay on w1
    state, move = router.on_step(state, "e", predicted_remaining=100, context_tokens=10, in_tool_call=True)
    assert move is None
    assert [v.worker_id for v in router.view(state)] == ["w1", "w1"]
    with pytest.raises(NotFound):
        router.route(state, "a")
    with pytest.raises(NotFound):
        router.finish(state, "a")


def test_bad_input() -> None:
    workers = [presorted_dp.WorkerProfile("w0", 1.0, TABLE)]
    placed = presorted_dp.plan([presorted_dp.Trajectory("a", 1)], workers)
    with pytest.raises(SpecError) as err:
        router.from_placement(placed, {})
    assert err.value.field == "predictions"
    state = router.from_placement(placed, {"a": 1})
    with pytest.raises(SpecError) as err:
        router.on_step(state, "a", predicted_remaining=-1, context_tokens=0, in_tool_call=True)
    assert err.value.field == "predicted_remaining"


@settings(derandomize=True, max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 5000), min_size=1, max_size=30),
    m=st.integers(1, 5),
    steps=st.lists(
        st.tuples(st.integers(0, 29), st.integers(0, 20_000), st.booleans(), st.booleans()), max_size=40
    ),
)
def test_router_invariants(lengths: list[int], m: int, steps: list[tuple[int, int, bool, bool]]) -> None:
    table = tuple(1.0 + 0.1 * s for s in range(64))
    workers = [presorted_dp.WorkerProfile(f"w{j}", 1.0, table) for j in range(m)]
    preds = {f"t{i}": float(x) for i, x in enumerate(lengths)}
    placed = presorted_dp.plan([presorted_dp.Trajectory(t, p) for t, p in preds.items()], workers)
    state = router.from_placement(placed, preds)
    for idx, new_pred, in_tool, finish in steps:
        tid = f"t{idx}"
        if tid not in state.entries:
            continue
        if finish:
            state = router.finish(state, tid)
        else:
            state, _ = router.on_step(
                state, tid, predicted_remaining=new_pred, context_tokens=100, in_tool_call=in_tool
            )
        views = router.view(state)
        assert sorted(v.rank for v in views) == list(range(len(state.entries)))  # ranks: a permutation
        assert all(router.route(state, v.trajectory_id) in state.workers for v in views)  # one known worker
        assert {m.trajectory_id for m in state.pending} <= set(state.entries)  # no move for a finished one
