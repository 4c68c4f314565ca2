"""Presorted-DP placement: hand-checked cases, brute force on tiny inputs, invariants, bad input."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from treadle.errors import SpecError
from treadle.policy.heddle import presorted_dp as dp

I4 = (1.0, 1.5, 2.0, 2.5)


def workers(m: int, table: tuple[float, ...] = I4, t_base: float = 1.0) -> list[dp.WorkerProfile]:
    return [dp.WorkerProfile(f"w{j}", t_base, table) for j in range(m)]


def trajs(*lengths: float) -> list[dp.Trajectory]:
    return [dp.Trajectory(f"t{i}", x) for i, x in enumerate(lengths)]


def brute_any(lengths: list[float], ws: list[dp.WorkerProfile]) -> float:
    """Eq. (2) over every assignment of trajectories to workers (m^n), not only contiguous ones."""
    best = math.inf
    for assign in itertools.product(range(len(ws)), repeat=len(lengths)):
        worst = 0.0
        for j, w in enumerate(ws):
            group = [x for x, a in zip(lengths, assign, strict=True) if a == j]
            if len(group) > len(w.interference):
                worst = math.inf
            elif group:
                worst = max(worst, max(group) * w.t_base * w.interference[len(group) - 1])
        best = min(best, worst)
    return best


def brute_contiguous(lengths: list[float], ws: list[dp.WorkerProfile]) -> float:
    """Eq. (2) over every contiguous split of the sorted lengths, workers in the given order."""
    n, best = len(lengths), math.inf
    for cuts in itertools.combinations_with_replacement(range(n + 1), len(ws) - 1):
        ends = [*cuts, n]
        start, worst = 0, 0.0
        for w, end in zip(ws, ends, strict=True):
            size = end - start
            if size > len(w.interference):
                worst = math.inf
            elif size:
                worst = max(worst, lengths[start] * w.t_base * w.interference[size - 1])
            start = end
        best = min(best, worst)
    return best


@pytest.mark.parametrize(
    ("lengths", "m", "want_groups", "want_makespan"),
    [
        # {10} {6,3,1}: max(10·1, 6·2) = 12 beats {10,6}{3,1} = 15 and {10,6,3}{1} = 20
        ((10, 6, 3, 1), 2, [["t0"], ["t1", "t2", "t3"]], 12.0),
        # one worker holds all: 10 · I(4) = 25
        ((10, 6, 3, 1), 1, [["t0", "t1", "t2", "t3"]], 25.0),
        # four workers: the longest alone is the bound, the rest spread evenly (one each)
        ((10, 6, 3, 1), 4, [["t0"], ["t1"], ["t2"], ["t3"]], 10.0),
        # equal lengths on 2 workers: 2+2, 5 · 1.5 = 7.5
        ((5, 5, 5, 5), 2, [["t0", "t1"], ["t2", "t3"]], 7.5),
        # input order does not matter: sorted descending first
        ((1, 10, 3, 6), 2, [["t1"], ["t3", "t2", "t0"]], 12.0),
    ],
    ids=["split-1-3", "one-worker", "one-each", "equal", "unsorted-input"],
)
def test_hand_checked(
    lengths: tuple[float, ...], m: int, want_groups: list[list[str]], want_makespan: float
) -> None:
    for exact in (False, True):
        placed = dp.plan(trajs(*lengths), workers(m), exact_dp=exact)
        assert [list(g.trajectory_ids) for g in placed.groups] == want_groups
        assert placed.makespan == pytest.approx(want_makespan)
        assert max(g.cost for g in placed.groups) == pytest.approx(want_makespan)


@settings(derandomize=True, max_examples=300, deadline=None)
@given(
    lengths=st.lists(st.sampled_from([0, 1, 2, 3, 5, 8, 13, 40]), min_size=1, max_size=6),
    m=st.integers(1, 3),
    steps=st.lists(st.sampled_from([0.0, 0.1, 0.5, 1.0]), min_size=6, max_size=6),
)
def test_equals_brute_force_on_identical_workers(lengths: list[int], m: int, steps: list[float]) -> None:
    table = tuple(itertools.accumulate([1.0, *steps]))
    ws = workers(m, table)
    ordered = sorted((float(x) for x in lengths), reverse=True)
    want = brute_any(ordered, ws)  # Lemma 5.1: contiguity loses nothing on identical workers
    assert dp.solve(ordered, [1] * len(ordered), ws).makespan == pytest.approx(want)
    assert dp.solve_dp(ordered, [1] * len(ordered), ws).makespan == pytest.approx(want)
    assert dp.plan(trajs(*lengths), ws).makespan == pytest.approx(want)


@settings(derandomize=True, max_examples=300, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 50), min_size=1, max_size=6),
    specs=st.lists(
        st.tuples(st.sampled_from([0.5, 1.0, 2.0]), st.integers(2, 6), st.sampled_from([0.2, 1.0])),
        min_size=1,
        max_size=3,
    ),
)
def test_equals_brute_force_on_heterogeneous_workers(
    lengths: list[int], specs: list[tuple[float, int, float]]
) -> None:
    ws = [
        dp.WorkerProfile(f"w{j}", t, tuple(1.0 + slope * s for s in range(size)))
        for j, (t, size, slope) in enumerate(specs)
    ]
    ordered = sorted((float(x) for x in lengths), reverse=True)
    want = brute_contiguous(ordered, ws)
    if math.isinf(want):
        with pytest.raises(SpecError):
            dp.solve(ordered, [1] * len(ordered), ws)
        return
    got = dp.solve(ordered, [1] * len(ordered), ws)
    assert got.makespan == pytest.approx(want)
    assert dp.solve_dp(ordered, [1] * len(ordered), ws).makespan == pytest.approx(want)
    # the balanced split of the same optimum stays under it
    part = dp.balanced(got.makespan, ordered, [1] * len(ordered), ws)
    assert max(dp.group_costs(part, ordered, [1] * len(ordered), ws)) <= got.makespan * (1 + 1e-12)


@settings(derandomize=True, max_examples=100, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 1000), min_size=0, max_size=40),
    m=st.integers(1, 8),
    below=st.integers(0, 1000),
    block=st.integers(1, 5),
)
def test_placement_invariants_with_merging(lengths: list[int], m: int, below: int, block: int) -> None:
    table = tuple(1.0 + 0.25 * s for s in range(64))
    ts = trajs(*lengths)
    merged = dp.plan(ts, workers(m, table), merge=dp.Merge(below=below, block=block))
    exact = dp.plan(ts, workers(m, table))
    placed = [t for g in merged.groups for t in g.trajectory_ids]
    assert sorted(placed) == sorted(t.trajectory_id for t in ts)  # each exactly once
    assert placed == list(merged.order)  # contiguous in the presorted order
    assert merged.makespan >= exact.makespan - 1e-9  # merging only coarsens the search
    assert max((g.cost for g in merged.groups), default=0.0) == pytest.approx(merged.makespan)
    # a block of short trajectories is never split across workers
    by_worker = {t: g.worker_id for g in merged.groups for t in g.trajectory_ids}
    order = list(merged.order)
    first_short = next(
        (i for i, t in enumerate(order) if ts[int(t[1:])].predicted_length < below), len(order)
    )
    for start in range(first_short, len(order), block):
        assert len({by_worker[t] for t in order[start : start + block]}) == 1


def slot_cost(group: list[float], w: dp.WorkerProfile) -> float:
    """A group's time, written out: all at once up to ``c``, past it ``I(c) · max(L_head, ΣL / c)``."""
    if len(group) > len(w.interference):
        return math.inf
    if w.slots and len(group) > w.slots:
        return w.t_base * w.interference[w.slots - 1] * max(max(group), sum(group) / w.slots)
    return max(group) * w.t_base * w.interference[len(group) - 1]


def test_hand_checked_slots_price_a_group_by_its_total_work() -> None:
    # I(s) = 1 + 0.1 (s - 1), 2 slots per worker; lengths 10, 10, 10 and eight 1s.
    table = tuple(1.0 + 0.1 * s for s in range(11))
    ws = [dp.WorkerProfile(f"w{j}", 1.0, table, slots=2) for j in range(2)]
    ts = trajs(10, 10, 10, *[1] * 8)
    # (2, 9): w0 {10, 10} = 10 · I(2) = 11; w1 {10, 1 x 8} = I(2) · max(10, 18 / 2) = 11: the 10 holds
    # one slot while the 1s take turns in the other. (3, 8): w0 = 1.1 · max(10, 30 / 2) = 16.5.
    # (1, 10): w1 = 1.1 · max(10, 28 / 2) = 15.4. Slot-blind, w1's ten would cost 10 · I(10) = 19.
    for exact in (False, True):
        placed = dp.plan(ts, ws, exact_dp=exact)
        assert placed.capacities() == (2, 9)
        assert placed.makespan == pytest.approx(11.0)
        assert [g.cost for g in placed.groups] == pytest.approx([11.0, 11.0])
    # a merged block counts its members' own lengths, not its head's times its size
    merged = dp.plan(ts, ws, merge=dp.Merge(below=5, block=4))
    assert merged.capacities() == (2, 9) and merged.makespan == pytest.approx(11.0)


@settings(derandomize=True, max_examples=300, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 50), min_size=1, max_size=7),
    specs=st.lists(
        st.tuples(
            st.sampled_from([0.5, 1.0]), st.integers(2, 7), st.sampled_from([0.1, 1.0]), st.integers(0, 3)
        ),
        min_size=1,
        max_size=3,
    ),
)
def test_slots_equal_brute_force_over_contiguous_splits(
    lengths: list[int], specs: list[tuple[float, int, float, int]]
) -> None:
    ws = [
        dp.WorkerProfile(f"w{j}", t, tuple(1.0 + slope * s for s in range(size)), slots=c)
        for j, (t, size, slope, c) in enumerate(specs)
    ]
    ordered = sorted((float(x) for x in lengths), reverse=True)
    n, want = len(ordered), math.inf
    for cuts in itertools.combinations_with_replacement(range(n + 1), len(ws) - 1):
        bounds = list(itertools.pairwise([0, *cuts, n]))
        want = min(
            want,
            max(slot_cost(ordered[a:b], w) if b > a else 0.0 for w, (a, b) in zip(ws, bounds, strict=True)),
        )
    ones = [1] * n
    if math.isinf(want):
        with pytest.raises(SpecError):
            dp.solve(ordered, ones, ws)
        return
    got = dp.solve(ordered, ones, ws)
    assert got.makespan == pytest.approx(want)
    assert dp.solve_dp(ordered, ones, ws).makespan == pytest.approx(want)
    part = dp.balanced(got.makespan, ordered, ones, ws)
    assert max(dp.group_costs(part, ordered, ones, ws)) <= got.makespan * (1 + 1e-12)


def test_interference_from_step_times() -> None:
    # steps 1.0, 1.2, 1.5 at batch 1..3; beyond B = 3 the head waits in waves: s / 3
    assert dp.interference_from_step_times([1.0, 1.2, 1.5], max_group=6) == pytest.approx(
        (1.0, 1.2, 1.5, 1.5 * 4 / 3, 1.5 * 5 / 3, 1.5 * 2)
    )
    # a noisy profile is made monotone
    assert dp.interference_from_step_times([1.0, 0.9], max_group=2) == (1.0, 1.0)


def test_interference_by_simulation_hand_checked() -> None:
    steps = [1.0, 1.2, 1.5]  # B = 3 running at most
    # equal lengths: up to B they run together (step(s)); the 4th waits a whole length and runs
    # alone: 1.5 + 1.0; the 5th and 6th run as a pair (1.2) or a triple (1.5) after the first wave
    assert dp.interference_by_simulation(steps, [1.0], max_group=6) == pytest.approx(
        (1.0, 1.2, 1.5, 2.5, 2.7, 3.0)
    )
    # lengths 1 and 0.5: together for 0.5 (1.2 each step), then the head alone: 0.6 + 0.5 = 1.1
    # three (1, 1, 0.5): 0.5 · 1.5 + 0.5 · 1.2 = 1.35; four (1, 1, .5, .5) simulated at the grid end
    table = dp.interference_by_simulation(steps, [1.0, 0.5], max_group=4, grid=4)
    assert table == pytest.approx((1.0, 1.1, 1.35, 1.5))
    # shorter members interfere less than the crude bound, which treats all as long as the head
    crude = dp.interference_from_step_times(steps, max_group=4)
    assert all(a <= b + 1e-12 for a, b in zip(table, crude, strict=True))
    with pytest.raises(SpecError) as err:
        dp.interference_by_simulation(steps, [0.0], max_group=2)
    assert err.value.field == "shape"


def test_heterogeneous_order_is_descending_tp() -> None:
    ws = [
        dp.WorkerProfile("small", 1.0, I4, tp=1),
        dp.WorkerProfile("big", 0.5, I4, tp=2),
    ]
    placed = dp.plan(trajs(10, 1), ws)
    # the longest trajectory goes to the highest-TP worker
    assert placed.groups[0].worker_id == "big"
    assert placed.groups[0].trajectory_ids == ("t0",)
    assert placed.capacities() == (1, 1)


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: dp.WorkerProfile("w", 1.0, (1.0, 0.5)), "interference"),
        (lambda: dp.WorkerProfile("w", 1.0, ()), "interference"),
        (lambda: dp.WorkerProfile("w", 0.0, I4), "t_base"),
        (lambda: dp.WorkerProfile("w", 1.0, I4, tp=0), "tp"),
        (lambda: dp.plan(trajs(1), [*workers(1), *workers(1)]), "workers"),
        (lambda: dp.plan([dp.Trajectory("a", -1)], workers(1)), "trajectories[0].predicted_length"),
        (lambda: dp.plan(trajs(1, 2), workers(1), merge=dp.Merge(5, 0)), "merge.block"),
        (lambda: dp.plan(trajs(*range(9)), workers(2)), "workers"),  # 9 > 2 · 4 slots
        (lambda: dp.plan(trajs(1), []), "workers"),
    ],
    ids=[
        "non-monotone",
        "empty-table",
        "t-base",
        "tp",
        "dup-worker",
        "negative",
        "block",
        "capacity",
        "none",
    ],
)
def test_bad_input_names_the_field(build: object, field: str) -> None:
    with pytest.raises(SpecError) as err:
        build()  # type: ignore[operator]
    assert err.value.field == field
