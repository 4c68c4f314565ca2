"""Batch formation: whole groups, eviction beyond alpha, per-task quotas, micro-batches."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from treadle.errors import SpecError
from treadle.policy import batching


def G(gid: str, *, task: str = "math", expected: int = 4, seq: int = 0, version: int = 0, arrived: int = 4,
      completed: int | None = None) -> batching.Group:  # fmt: skip
    done = arrived if completed is None else completed
    return batching.Group(gid, task, expected, seq, version, arrived, done)


@pytest.mark.parametrize(
    ("groups", "batch_size", "expected"),
    [
        # two full groups of 4 make a batch of 8, oldest first
        ([G("b", seq=2), G("a", seq=1), G("c", seq=3)], 8, [["a", "b"]]),
        # a group still missing a member is not ready; c (newer) goes before it
        ([G("a", seq=1, arrived=3), G("b", seq=2), G("c", seq=3)], 8, [["b", "c"]]),
        # only 4 ready for a batch of 8 -> nothing yet
        ([G("a", seq=1), G("b", seq=2, arrived=1)], 8, []),
        # failed members are not delivered: 3 + 4 = 7 < 8 -> needs the third group; batch 11 >= 8
        ([G("a", seq=1, completed=3), G("b", seq=2), G("c", seq=3)], 8, [["a", "b", "c"]]),
        # an all-failed group is skipped, never delivered
        ([G("a", seq=1, completed=0), G("b", seq=2), G("c", seq=3)], 8, [["b", "c"]]),
        # batch 4 drains three groups one by one, oldest first
        ([G("c", seq=3), G("a", seq=1), G("b", seq=2)], 4, [["a"], ["b"], ["c"]]),
    ],
    ids=["oldest-first", "incomplete-waits", "not-enough", "failed-not-counted", "empty-skipped", "drain"],
)
def test_drain(groups: list[batching.Group], batch_size: int, expected: list[list[str]]) -> None:
    assert batching.drain(groups, batch_size=batch_size) == expected


def test_stale_and_empty() -> None:
    groups = [G("old", seq=1, version=0), G("ok", seq=2, version=1), G("dead", seq=3, version=2, completed=0)]
    assert batching.stale_groups(groups, version=2, alpha=1) == ["old"]
    assert batching.stale_groups(groups, version=1, alpha=1) == []
    assert batching.empty_groups(groups) == ["dead"]


@pytest.mark.parametrize(
    ("weights", "expected"),
    [
        ({"math": 1, "code": 1}, {"code": 4, "math": 4}),
        ({"math": 3, "code": 1}, {"code": 2, "math": 6}),
        ({"a": 1, "b": 1, "c": 1}, {"a": 3, "b": 3, "c": 2}),  # remainder ties go by name
        ({"math": 1, "code": 0}, {"math": 8}),
    ],
    ids=["even", "3-to-1", "largest-remainder", "zero-weight"],
)
def test_quotas(weights: dict[str, float], expected: dict[str, int]) -> None:
    assert batching.quotas(8, weights) == expected


def test_quota_errors_name_the_field() -> None:
    with pytest.raises(SpecError) as bad:
        batching.quotas(8, {"math": -1})
    assert bad.value.field == "task_weights.math"
    with pytest.raises(SpecError) as none:
        batching.quotas(8, {"math": 0})
    assert none.value.field == "task_weights"
    with pytest.raises(SpecError) as size:
        batching.plan_batch([], batch_size=0)
    assert size.value.field == "batch_size"


def test_weighted_batch_waits_for_each_quota() -> None:
    groups = [G("m1", seq=1), G("m2", seq=2), G("c1", task="code", seq=3, arrived=2)]
    weights = {"math": 1, "code": 1}
    assert batching.plan_batch(groups, batch_size=8, task_weights=weights) is None  # code not ready
    ready = [*groups[:2], G("c1", task="code", seq=3)]
    assert batching.plan_batch(ready, batch_size=8, task_weights=weights) == ["m1", "c1"]
    # an unweighted task is never batched
    assert batching.plan_batch([G("x", task="other")], batch_size=4, task_weights={"math": 1}) is None


def test_micro_batches_release_as_they_fill() -> None:
    groups = [G("a", seq=1), G("b", seq=2, arrived=2)]
    assert batching.plan_micro_batch(groups, micro_batch_size=4, remaining=8) == ["a"]
    assert batching.plan_micro_batch(groups[1:], micro_batch_size=4, remaining=4) is None
    # the tail micro-batch asks only for what the batch still needs
    assert batching.plan_micro_batch(
        [G("c", seq=3, expected=2, arrived=2)], micro_batch_size=4, remaining=2
    ) == ["c"]
    assert batching.plan_micro_batch(groups, micro_batch_size=4, remaining=0) is None


@given(
    st.lists(
        st.tuples(st.integers(1, 4), st.integers(0, 4), st.integers(0, 4), st.sampled_from(["m", "c"])),
        max_size=12,
    ),
    st.integers(1, 12),
)
def test_drain_invariants(shapes: list[tuple[int, int, int, str]], batch_size: int) -> None:
    groups = [
        batching.Group(f"g{i}", task, expected, i, 0, min(arrived, expected), min(done, arrived, expected))
        for i, (expected, arrived, done, task) in enumerate(shapes)
    ]
    by_id = {g.group_id: g for g in groups}
    batches = batching.drain(groups, batch_size=batch_size)
    seen = [gid for b in batches for gid in b]
    assert len(seen) == len(set(seen))  # a group is delivered at most once
    for batch in batches:
        assert all(batching.is_ready(by_id[g]) and by_id[g].completed > 0 for g in batch)
        total = sum(by_id[g].completed for g in batch)
        assert total >= batch_size
        assert total - by_id[batch[-1]].completed < batch_size  # overshoot below one group
