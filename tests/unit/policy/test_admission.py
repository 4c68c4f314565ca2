"""Staleness-bounded admission (AReaL rule) and RollArt's per-iteration check, hand-checked."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from treadle.policy import admission, batching

S = admission.AdmissionState
L = admission.Limits


@pytest.mark.parametrize(
    ("state", "limits", "expected"),
    [
        # fresh start, alpha 1, B 8: (1+0+1)*8 - 0 = 16, concurrency 100 -> 16
        (S(0, 0, 0), L(1, 8, 100), 16),
        # 10 running: min(100-10, 16-10) = 6
        (S(0, 0, 10), L(1, 8, 100), 6),
        # concurrency binds: min(12-10, 16-10) = 2
        (S(0, 0, 10), L(1, 8, 12), 2),
        # window full at version 0 -> 0 until the version moves
        (S(0, 8, 8), L(1, 8, 100), 0),
        # version 1 opens one more batch: 3*8 - 16 = 8
        (S(1, 8, 8), L(1, 8, 100), 8),
        # alpha 0 is fully synchronous: one batch per version
        (S(0, 0, 0), L(0, 8, 100), 8),
        # over-admitted (after a restore) never goes negative
        (S(0, 30, 10), L(1, 8, 100), 0),
    ],
    ids=["fresh", "running", "concurrency-binds", "window-full", "next-version", "sync", "never-negative"],
)
def test_capacity(state: admission.AdmissionState, limits: admission.Limits, expected: int) -> None:
    assert admission.capacity(state, limits) == expected


def test_admit_whole_groups_while_any_room_is_left() -> None:
    # room for 6 with groups of 4: two whole groups (a group starts while room is left: 2 over)
    assert admission.admit_groups(S(0, 0, 10), L(1, 8, 100), group_size=4, pending_groups=5) == 2
    assert admission.admit_groups(S(0, 0, 16), L(1, 8, 100), group_size=4, pending_groups=5) == 0
    assert admission.admit_groups(S(0, 0, 0), L(1, 8, 100), group_size=4, pending_groups=2) == 2
    assert admission.admit_groups(S(0, 0, 0), L(1, 8, 100), group_size=0, pending_groups=2) == 0
    # never past the concurrency cap, even with room in the window
    assert admission.admit_groups(S(0, 0, 6), L(3, 8, 8), group_size=4, pending_groups=5) == 0


def test_failed_members_never_stall_the_trainer_at_the_window() -> None:
    """The dev cluster's stall: version 9 committed, batch 32 of groups of 8, alpha 1; the trainer took
    10 batches (320) and waits for the 11th; the buffer holds 28 completed in 4 groups with holes
    (failed members), nothing runs. Counted as 348 accepted, the window (352) had 4 places: no group
    of 8 fit and the run stalled for good. A group now starts in those 4."""
    stalled = S(9, 348, 0, consumed=320)
    assert admission.admit_groups(stalled, L(1, 32, 256), group_size=8, pending_groups=4) == 1
    # Batches of partial groups took 360 (not 320): that excess no longer holds the window shut.
    excess = S(9, 388, 0, consumed=360)
    assert admission.capacity(excess, L(1, 32, 256)) == admission.capacity(stalled, L(1, 32, 256))
    assert admission.admit_groups(S(9, 388, 0), L(1, 32, 256), group_size=8, pending_groups=4) == 0


@given(
    holes=st.lists(st.integers(0, 7), min_size=1, max_size=60),
    alpha=st.integers(1, 3),
    seed=st.integers(0, 10_000),
)
def test_a_run_whose_members_fail_never_deadlocks(holes: list[int], alpha: int, seed: int) -> None:
    """A live-like loop: admission, groups of 8 whose members fail ``holes[i]`` at a time, the buffer's
    batching (completed members only, until 32 are in) and a trainer committing a version per batch.
    Whatever the failures, every group is admitted and the trainer never waits with nothing running."""
    rng = random.Random(seed)
    batch, members, total = 32, 8, len(holes)
    pending, version, completed, consumed, started, batches = total, 0, 0, 0, 0, 0
    stored: list[batching.Group] = []
    for _ in range(10 * total + 10):
        state = S(version, completed, 0, consumed=consumed)
        n = admission.admit_groups(state, L(alpha, batch, 1000), group_size=members, pending_groups=pending)
        for _ in range(n):
            ok = members - holes[started]
            stored.append(batching.Group(f"g{started}", "t", members, started, version, members, ok))
            started += 1
            completed += ok
        pending -= n
        stored = [g for g in stored if g.completed > 0]  # empty groups are retired
        plan = batching.plan_batch(stored, batch_size=batch)
        if plan is None:
            if pending == 0:
                break
            assert n > 0, f"stalled at version {version}: {pending} groups waiting, nothing admitted"
            continue
        consumed += sum(g.completed for g in stored if g.group_id in plan)
        stored = [g for g in stored if g.group_id not in plan]
        batches += 1
        version = max(version, batches - rng.choice((1, 2)))  # the commit lags one batch or two
    assert pending == 0


@pytest.mark.parametrize(
    ("in_flight", "version", "alpha", "expected"),
    [
        ({"a": 0, "b": 1, "c": 2}, 2, 1, ["a"]),  # 0 < 2-1
        ({"a": 0, "b": 1, "c": 2}, 2, 0, ["a", "b"]),  # alpha 0 aborts everything older
        ({"a": 0, "b": 1}, 1, 1, []),  # within the window
        ({}, 5, 1, []),
    ],
    ids=["alpha1", "alpha0", "within", "empty"],
)
def test_stale_in_flight(in_flight: dict[str, int], version: int, alpha: int, expected: list[str]) -> None:
    assert admission.stale_in_flight(in_flight, version=version, alpha=alpha) == expected


def test_run_to_completion_table() -> None:
    # alpha 1, B 4, groups of 2, 4 groups; 2 finish per round; version +1 every 2 rounds
    steps = admission.run_to_completion(
        L(1, 4, 100), group_size=2, total_groups=4, finish_per_round=2, rounds_per_version=2
    )
    assert [(s.version, s.admitted, s.running, s.accepted) for s in steps] == [
        (0, 8, 6, 2),  # window (1+0+1)*4 = 8 -> all four groups start
        (1, 0, 4, 4),
        (1, 0, 2, 6),
        (2, 0, 0, 8),
    ]


@given(
    alpha=st.integers(0, 3),
    batch=st.integers(1, 16),
    group=st.integers(1, 8),
    groups=st.integers(0, 40),
    finish=st.integers(1, 20),
    per_version=st.integers(1, 5),
)
def test_started_never_exceeds_window(alpha: int, batch: int, group: int, groups: int, finish: int,
                                      per_version: int) -> None:  # fmt: skip
    limits = L(alpha, batch, 64)
    steps = admission.run_to_completion(
        limits, group_size=group, total_groups=groups, finish_per_round=finish, rounds_per_version=per_version
    )
    started = 0
    version = 0
    for step in steps:
        started += step.admitted
        # admitted under `version` (the version before this round's bump)
        whole = admission.batch_trajectories(batch, group)
        assert started <= max((alpha + version + 1) * whole, 0) or step.admitted == 0
        assert step.running <= limits.max_in_flight
        version = step.version
    if steps:
        assert steps[-1].accepted == started


def test_partial_last_group_is_admitted_when_batch_is_not_a_multiple_of_members() -> None:
    # issue #4: alpha 0, batch 6, groups of 4. The buffer's batch is two whole groups (8), so the
    # window is 8; counted as 6 the second group never fit and the run deadlocked.
    assert admission.batch_trajectories(6, 4) == 8
    assert admission.admit_groups(S(0, 0, 0), L(0, 6, 100), group_size=4, pending_groups=5) == 2
    assert admission.admit_groups(S(0, 4, 0), L(0, 6, 100), group_size=4, pending_groups=1) == 1


@pytest.mark.parametrize(("batch", "members"), [(6, 4), (5, 3), (7, 5), (8, 4), (1, 3)])
def test_sync_rollout_with_a_trainer_never_deadlocks(batch: int, members: int) -> None:
    # Admission, a trainer that takes whole groups (batching.plan_batch) and bumps the version per
    # batch; every group finishes in the round it starts. Before the fix (6, 4), (5, 3) and (7, 5) hung.
    total = 6
    pending, version, accepted, started = total, 0, 0, 0
    stored: list[batching.Group] = []
    for _ in range(100):
        n = admission.admit_groups(S(version, accepted, 0), L(0, batch, 1000), group_size=members,
                                   pending_groups=pending)  # fmt: skip
        for _ in range(n):
            stored.append(batching.Group(f"g{started}", "t", members, started, version, members, members))
            started += 1
        pending -= n
        accepted += n * members
        plan = batching.plan_batch(stored, batch_size=batch)
        if plan is None:
            if pending == 0:
                break
            continue
        stored = [g for g in stored if g.group_id not in plan]
        version += 1
    assert pending == 0, f"deadlocked at version {version} with {pending} groups never admitted"
