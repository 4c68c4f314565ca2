"""Opportunistic migration: scaled capacities, target worker, cost model, transfer epochs."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from treadle.errors import SpecError
from treadle.policy.heddle import migration

A = migration.Active
M = migration.Migration


@pytest.mark.parametrize(
    ("caps", "n_active", "want"),
    [
        ((2, 3, 5), 10, (2, 3, 5)),  # nothing finished: unchanged
        ((2, 3, 5), 5, (1, 2, 2)),  # exact 1, 1.5, 2.5: remainders tie at .5, the earlier worker wins
        ((1, 1, 8), 4, (1, 0, 3)),  # exact .4, .4, 3.2: floors 0+0+3, the unit left goes to the first .4
        ((4, 4), 1, (1, 0)),  # one left: the first group (the longest) keeps it
        ((3, 0, 3), 0, (0, 0, 0)),
    ],
    ids=["full", "half", "skewed", "one-left", "none-left"],
)
def test_scaled_capacities(caps: tuple[int, ...], n_active: int, want: tuple[int, ...]) -> None:
    assert migration.scaled_capacities(caps, n_active) == want


@settings(derandomize=True)
@given(caps=st.lists(st.integers(0, 50), min_size=1, max_size=8), frac=st.floats(0, 1))
def test_scaled_capacities_sum(caps: list[int], frac: float) -> None:
    if sum(caps) == 0:
        return
    n_active = int(sum(caps) * frac)
    scaled = migration.scaled_capacities(caps, n_active)
    assert sum(scaled) == n_active
    assert all(abs(s - c * n_active / sum(caps)) < 1 for s, c in zip(scaled, caps, strict=True))


def test_target_worker_intervals() -> None:
    # capacities 1, 2, 3: ranks 0 | 1 2 | 3 4 5
    got = [migration.target_worker(r, ["a", "b", "c"], [1, 2, 3]) for r in range(6)]
    assert got == ["a", "b", "b", "c", "c", "c"]
    with pytest.raises(SpecError) as err:
        migration.target_worker(6, ["a", "b", "c"], [1, 2, 3])
    assert err.value.field == "rank"


def test_cost_model_hand_checked() -> None:
    kv = migration.MigrationCost(
        mode="kv-transfer", overhead_s=0.1, kv_bytes_per_token=1000, bandwidth_bytes_per_s=1e6
    )
    assert kv.move_seconds(2000) == pytest.approx(0.1 + 2.0)
    # a 3 s tool call hides prediction 0.2 + move 2.1 entirely; a 1 s one leaves 1.3 s exposed
    assert kv.exposed_seconds(2000, tool_seconds=3.0, predict_seconds=0.2) == 0.0
    assert kv.exposed_seconds(2000, tool_seconds=1.0, predict_seconds=0.2) == pytest.approx(1.3)
    prefill = migration.MigrationCost(mode="re-prefill", overhead_s=0.05, prefill_tokens_per_s=10_000)
    assert prefill.move_seconds(20_000) == pytest.approx(2.05)
    # the paper's Qwen3-14B over 400 Gb/s: 20K tokens of 160 KiB are 3.3 GB, about 0.07 s of wire
    default_kv = migration.MigrationCost(mode="kv-transfer", overhead_s=0.0)
    assert default_kv.move_seconds(20_000) == pytest.approx(20_000 * 160 * 1024 / 50e9)


WORKERS = ["w0", "w1"]
CAPS = [1, 3]  # the placement gave w0 the longest trajectory alone, w1 the next three


@pytest.mark.parametrize(
    ("trajectory", "active", "max_exposed", "want"),
    [
        (
            "c",  # c was predicted short (w1) but is now the longest: rank 0 -> w0, during its tool call
            [A("a", "w0", 50, 1000), A("b", "w1", 40, 1000), A("c", "w1", 900, 1000, True, 5.0)],
            math.inf,
            M("c", "w1", "w0", 900, 0.05 + 1000 / 20_000, 0.0),
        ),
        (
            "c",  # same, but not in a tool call: never moves while generating
            [A("a", "w0", 50, 1000), A("b", "w1", 40, 1000), A("c", "w1", 900, 1000, False)],
            math.inf,
            None,
        ),
        (
            "a",  # a is still the longest: its target is its own worker
            [A("a", "w0", 50, 1000, True, 1.0), A("b", "w1", 40, 1000)],
            math.inf,
            None,
        ),
        (
            "c",  # a math-like 0.01 s tool call cannot hide the 0.1 s re-prefill: over budget, stays
            [A("a", "w0", 50, 1000), A("c", "w1", 900, 1000, True, 0.01)],
            0.05,
            None,
        ),
    ],
    ids=["misclassified-tail-moves", "not-in-tool", "already-there", "over-budget"],
)
def test_decide(
    trajectory: str, active: list[migration.Active], max_exposed: float, want: migration.Migration | None
) -> None:
    got = migration.decide(
        trajectory,
        active,
        workers=WORKERS,
        capacities=CAPS,
        cost=migration.MigrationCost(),
        max_exposed_s=max_exposed,
    )
    assert got == (None if want is None else pytest.approx(want))


def test_decide_unknown_trajectory() -> None:
    with pytest.raises(SpecError) as err:
        migration.decide("zz", [], workers=WORKERS, capacities=CAPS, cost=migration.MigrationCost())
    assert err.value.field == "trajectory_id"


def decide_two(me: str, active: list[migration.Active], caps: tuple[int, int], stale: float) -> str | None:
    move = migration.decide(
        me, active, workers=("w0", "w1"), capacities=caps, cost=migration.MigrationCost(), stale_tokens=stale
    )
    return None if move is None else move.target


def test_a_fresh_prediction_does_not_slide_below_stale_equals() -> None:
    # a was just re-predicted (100, a turn of 32 tokens less); c's 105 is a turn old. By rank a is
    # third (b 120, c 105, a 100), outside w0's two ranks: the paper's rule moves it, and c moves
    # back at its own next step, and so on. Counting c as a possible tie (100 <= 105 <= 132), the
    # ranks 0..2 go to {a, b, c}, w0 has two of them and two of those ranks: a stays.
    active = [A("a", "w0", 100, 0, True), A("b", "w0", 120, 0), A("c", "w1", 105, 0), A("d", "w1", 10, 0)]
    assert decide_two("a", active, (2, 2), 0.0) == "w1"
    assert decide_two("a", active, (2, 2), 32.0) is None


def test_equally_long_trajectories_still_split_as_planned() -> None:
    # four alike on w0, the plan gives each worker two: w0 holds four of the tied ranks, has room for
    # two, so the one just re-predicted still moves.
    active = [A("a", "w0", 90, 0, True), A("b", "w0", 100, 0), A("c", "w0", 100, 0), A("d", "w0", 100, 0)]
    assert decide_two("a", active, (2, 2), 32.0) == "w1"
    with pytest.raises(SpecError) as err:
        decide_two("a", active, (2, 2), -1.0)
    assert err.value.field == "stale_tokens"


def mig(t: str, src: str, dst: str, length: float) -> migration.Migration:
    return M(t, src, dst, length, 0.1, 0.0)


def test_transfer_epochs_longest_first_endpoint_exclusive() -> None:
    pending = [
        mig("t1", "w0", "w1", 100),
        mig("t2", "w1", "w2", 300),  # longest: launches first, takes w1 and w2
        mig("t3", "w3", "w0", 200),  # w3, w0 free: launches beside t2
        mig("t4", "w2", "w3", 50),
    ]
    epochs = migration.run_to_completion(pending)
    assert [[m.trajectory_id for m in e] for e in epochs] == [
        ["t2", "t3"],  # epoch 1: t1 needs w1 (busy with t2), t4 needs w2 (busy)
        ["t1", "t4"],  # epoch 2: w0-w1 and w2-w3 are disjoint
    ]
    # endpoints busy from an earlier epoch block a launch
    assert migration.schedule_epoch([mig("t1", "w0", "w1", 1)], busy={"w1"}) is None
    assert migration.schedule_epoch([]) is None
