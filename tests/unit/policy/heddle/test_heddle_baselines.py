"""Heddle's baselines: queue orders and per-step placement rules, on hand-checked tables."""

from __future__ import annotations

import pytest

from treadle.errors import SpecError
from treadle.policy.heddle import baselines as b

# (id, step arrival, trajectory arrival, tokens generated, predicted remaining)
QUEUE = [
    b.Queued("a", step_seq=3, trajectory_seq=0, attained=900, predicted_remaining=100.0),
    b.Queued("b", step_seq=1, trajectory_seq=2, attained=50, predicted_remaining=5000.0),
    b.Queued("c", step_seq=2, trajectory_seq=1, attained=400, predicted_remaining=5000.0),
    b.Queued("d", step_seq=0, trajectory_seq=3, attained=50, predicted_remaining=10.0),
]


@pytest.mark.parametrize(
    "scheduling,want",
    [
        ("round-robin", ["d", "b", "c", "a"]),  # this step's arrival: a re-queued step goes to the tail
        ("fcfs", ["a", "c", "b", "d"]),  # the trajectory that came first keeps going first
        ("autellix", ["d", "b", "c", "a"]),  # least attained service; b/d tie on 50 -> step arrival
        ("progressive", ["b", "c", "a", "d"]),  # LPT on predicted remaining; b/c tie -> earlier step
    ],
    ids=["round-robin", "fcfs", "autellix", "progressive"],
)
def test_order(scheduling: b.Scheduling, want: list[str]) -> None:
    assert b.order(QUEUE, scheduling) == want


def test_unknown_scheduling() -> None:
    with pytest.raises(SpecError):
        b.order(QUEUE, "sjf")  # type: ignore[arg-type]


LOADS = [b.Load("w0", 10), b.Load("w1", 2), b.Load("w2", 2), b.Load("w3", 40)]


@pytest.mark.parametrize(
    "previous,abs_threshold,want",
    [
        (None, 32, "w1"),  # a first step goes to the least loaded (ties by id)
        ("w0", 32, "w1"),  # imbalanced (40 - 2 = 38 > 32): the least loaded, the cache is lost
        ("w0", 40, "w0"),  # balanced enough: stay where the prefix is cached
        ("w3", 0, "w1"),  # threshold 0: always the least loaded
    ],
)
def test_least_load(previous: str | None, abs_threshold: float, want: str) -> None:
    assert b.least_load(LOADS, previous, abs_threshold=abs_threshold) == want


def test_least_load_relative_threshold_blocks_a_move() -> None:
    loads = [b.Load("w0", 100), b.Load("w1", 60)]
    # 40 more requests, but w0 is under 2x w1: not imbalanced under rel_threshold=2
    assert b.least_load(loads, "w0", abs_threshold=32, rel_threshold=2.0) == "w0"
    assert b.least_load(loads, "w0", abs_threshold=32, rel_threshold=1.5) == "w1"


def test_cache_aware_and_static() -> None:
    assert b.cache_aware(LOADS, "w3") == "w3"  # ignores load entirely
    assert b.cache_aware(LOADS, None) == "w1"
    assert b.cache_aware(LOADS, "gone") == "w1"  # the previous worker left: least loaded
    assert [b.static(i, ["w0", "w1", "w2"]) for i in range(5)] == ["w0", "w1", "w2", "w0", "w1"]
    with pytest.raises(SpecError):
        b.static(0, [])
    with pytest.raises(SpecError):
        b.least_load([], None)
