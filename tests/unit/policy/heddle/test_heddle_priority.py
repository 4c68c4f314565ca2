"""Progressive priority (LPT on predicted remaining work) and Algorithm 1's preemption rounds."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from treadle.errors import SpecError
from treadle.policy.heddle import priority

R = priority.Request
A = priority.Action


def q(running: list[tuple[str, float]], waiting: list[tuple[str, float]], slots: int) -> priority.WorkerQueue:
    seq = iter(range(100))
    return priority.WorkerQueue.of(
        running=[R(t, p, next(seq)) for t, p in running],
        waiting=[R(t, p, next(seq)) for t, p in waiting],
        slots=slots,
    )


@pytest.mark.parametrize(
    ("state", "margin", "want_actions", "want_running"),
    [
        (
            q([], [("a", 5), ("b", 9), ("c", 1)], 2),
            0.0,
            [A("b"), A("a")],  # free slots: highest predicted remaining first; c waits
            {"a", "b"},
        ),
        (
            q([("a", 5), ("b", 1)], [("c", 9), ("d", 3), ("e", 0.5)], 2),
            0.0,
            # c (9) beats the lowest running b (1): b goes back to waiting; then d (3) does not
            # beat the new lowest a (5), so the round stops
            [A("c", preempt="b")],
            {"a", "c"},
        ),
        (
            q([("a", 5), ("b", 1)], [("c", 9), ("d", 3)], 2),
            9.0,
            [],  # margin 9: c must exceed 1 · (1 + 9) = 10; 9 does not
            {"a", "b"},
        ),
        (
            q([("a", 2), ("b", 1)], [("c", 9), ("d", 8)], 2),
            0.0,
            [A("c", preempt="b"), A("d", preempt="a")],  # both tails replace both shorts
            {"c", "d"},
        ),
        (
            q([("a", 4)], [("b", 4)], 1),
            0.0,
            [],  # equal priority never preempts (no thrash between equals)
            {"a"},
        ),
        (
            q([("a", 4)], [], 0),
            0.0,
            [],  # nothing waiting
            {"a"},
        ),
    ],
    ids=["fill-slots", "one-preemption", "margin-holds", "two-preemptions", "tie-no-thrash", "empty"],
)
def test_round(
    state: priority.WorkerQueue, margin: float, want_actions: list[priority.Action], want_running: set[str]
) -> None:
    actions, after = priority.run_to_completion(state, margin=margin)
    assert actions == want_actions
    assert {r.trajectory_id for r in after.running} == want_running


def test_key_total_adds_generated_tokens() -> None:
    short_left_long_done = R("a", 10, seq=0, tokens_so_far=1000)
    long_left = R("b", 500, seq=1, tokens_so_far=0)
    assert [r.trajectory_id for r in priority.order([short_left_long_done, long_left])] == ["b", "a"]
    assert [r.trajectory_id for r in priority.order([short_left_long_done, long_left], key="total")] == [
        "a",
        "b",
    ]


def test_ties_go_to_earlier_arrival_then_id() -> None:
    reqs = [R("z", 5, seq=2), R("y", 5, seq=1), R("x", 5, seq=1), R("w", 6, seq=9)]
    assert priority.ranks(reqs) == {"w": 0, "x": 1, "y": 2, "z": 3}


def test_progressive_updates_reorder_the_queue() -> None:
    # each step boundary re-inserts the trajectory with its new prediction
    waiting: tuple[priority.Request, ...] = ()
    for req in [R("a", 100, 0), R("b", 50, 1), R("c", 10, 2)]:
        waiting = priority.insert(waiting, req)
    assert [r.trajectory_id for r in waiting] == ["a", "b", "c"]
    waiting = priority.insert(waiting, R("c", 400, 3))  # c turned out to be a long-tail trajectory
    assert [r.trajectory_id for r in waiting] == ["c", "a", "b"]
    waiting = priority.insert(waiting, R("a", 5, 4))  # a is almost done
    assert [r.trajectory_id for r in waiting] == ["c", "b", "a"]


@settings(derandomize=True)
@given(
    running=st.lists(st.floats(0, 100), max_size=6),
    waiting=st.lists(st.floats(0, 100), max_size=8),
    slots=st.integers(0, 6),
    margin=st.sampled_from([0.0, 0.1, 1.0]),
)
def test_round_invariants(running: list[float], waiting: list[float], slots: int, margin: float) -> None:
    running = running[:slots]
    state = q(
        [(f"r{i}", p) for i, p in enumerate(running)], [(f"w{i}", p) for i, p in enumerate(waiting)], slots
    )
    _, after = priority.run_to_completion(state, margin=margin)
    assert len(after.running) <= slots
    assert list(after.running) == priority.order(after.running)  # apply keeps dispatch order
    assert list(after.waiting) == priority.order(after.waiting)
    assert len(after.running) + len(after.waiting) == len(running) + len(waiting)
    if after.waiting:
        assert len(after.running) == slots  # no free slot while requests wait
        if after.running:
            best_waiting = max(r.predicted_remaining for r in after.waiting)
            worst_running = min(r.predicted_remaining for r in after.running)
            assert best_waiting <= worst_running * (1 + margin)


def test_bad_input() -> None:
    with pytest.raises(SpecError) as err:
        priority.next_action(q([], [("a", 1)], 1), margin=-1)
    assert err.value.field == "margin"
    with pytest.raises(SpecError) as err:
        priority.apply(q([], [("a", 1)], 1), A("zz"))
    assert err.value.field == "action.admit"
