"""Placement v1: sticky least-loaded choice, pinned by whole-sequence tables (lws style)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from treadle.policy import placement

W = placement.WorkerState


def _ids(decisions: list[placement.Decision | None]) -> list[str | None]:
    return [d.worker_id if d else None for d in decisions]


@pytest.mark.parametrize(
    ("workers", "turns", "expected"),
    [
        # three fresh turns spread over two idle workers: a, b, then a again (ties by id)
        ([W("a", "h20", 0), W("b", "h20", 0)], [None, None, None], ["a", "b", "a"]),
        # sticky keeps b while within slack (2) of the least-loaded: b=1, b=2, then b=3 > 0+2 -> a
        ([W("a", "h20", 0), W("b", "h20", 1)], ["b", "b", "b"], ["b", "b", "a"]),
        # sticky b at load 3 vs a at 0: beyond slack -> moves to a; then a=1,b=3 -> b within slack
        ([W("a", "h20", 0), W("b", "h20", 3)], ["b", "b"], ["a", "b"]),
        # an unhealthy previous worker is never kept
        ([W("a", "h20", 5), W("b", "h20", 0, healthy=False)], ["b"], ["a"]),
        # a previous worker outside the eligible pools is never kept
        ([W("a", "h20", 5), W("x", "h800", 0)], ["x"], ["a"]),
        # nothing healthy and eligible -> None for every turn
        ([W("a", "h20", 0, healthy=False), W("x", "h800", 0)], [None, "a"], [None, None]),
        # equal load: lower KV usage wins
        ([W("a", "h20", 1, 0.9), W("b", "h20", 1, 0.1)], [None], ["b"]),
    ],
    ids=["spread-ties-by-id", "sticky-within-slack", "sticky-beyond-slack", "sticky-unhealthy",
         "sticky-wrong-pool", "no-candidate", "kv-tiebreak"],
)  # fmt: skip
def test_assign_sequence(workers: list[W], turns: list[str | None], expected: list[str | None]) -> None:
    requests = [placement.TurnRequest(trajectory_id=f"t{i}", previous=p) for i, p in enumerate(turns)]
    decisions = placement.assign_sequence(requests, workers, eligible_pools=["h20"])
    assert _ids(decisions) == expected


def test_reasons() -> None:
    workers = [W("a", "p", 0), W("b", "p", 1)]
    assert placement.choose_worker(workers, eligible_pools=["p"], previous="b") == placement.Decision(
        "b", "sticky"
    )
    assert placement.choose_worker(workers, eligible_pools=["p"]) == placement.Decision("a", "least-loaded")


def test_assigned_counts_break_ties_so_sessions_spread() -> None:
    workers = [W("a", "p", 0), W("b", "p", 0)]
    decision = placement.choose_worker(workers, eligible_pools=["p"], assigned={"a": 3})
    assert decision == placement.Decision("b", "least-loaded")


@given(
    loads=st.lists(
        st.tuples(st.integers(0, 20), st.booleans(), st.sampled_from(["p", "q"])), min_size=1, max_size=8
    ),
    previous=st.one_of(st.none(), st.integers(0, 7)),
    slack=st.integers(0, 4),
)
def test_invariants(loads: list[tuple[int, bool, str]], previous: int | None, slack: int) -> None:
    workers = [W(f"w{i}", pool, load, healthy=ok) for i, (load, ok, pool) in enumerate(loads)]
    prev = f"w{previous}" if previous is not None else None
    decision = placement.choose_worker(workers, eligible_pools=["p"], previous=prev, slack=slack)
    candidates = [w for w in workers if w.healthy and w.pool == "p"]
    if not candidates:
        assert decision is None
        return
    assert decision is not None
    chosen = next(w for w in workers if w.worker_id == decision.worker_id)
    assert chosen.healthy and chosen.pool == "p"
    min_load = min(w.load for w in candidates)
    if decision.reason == "sticky":
        assert chosen.worker_id == prev and chosen.load <= min_load + slack
    else:
        assert chosen.load == min_load
