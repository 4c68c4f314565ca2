"""The feeder's pure planning: a fixed shuffle per (seed, epoch), position math, demand and its split."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from treadle.policy import feeding
from treadle.policy.feeding import Position, Slot


def test_permutation_is_a_permutation_fixed_by_seed_and_epoch() -> None:
    order = feeding.permutation(50, seed=7, epoch=0)
    assert sorted(order) == list(range(50))
    assert order == feeding.permutation(50, seed=7, epoch=0)
    assert order != feeding.permutation(50, seed=7, epoch=1)
    assert order != feeding.permutation(50, seed=8, epoch=0)
    assert order != tuple(range(50))


def test_permutation_is_pinned() -> None:
    """The order is a contract with positions stored in Redis: a change would repeat and skip rows of
    an epoch a feeder resumes after an upgrade. Regenerating this row needs a migration, not an edit."""
    assert feeding.permutation(8, seed=0, epoch=0) == (1, 3, 7, 6, 5, 4, 0, 2)


# (rows, epochs, position, count) -> (slots as (epoch, offset), position after)
TAKES = {
    "from the start": (4, 2, Position(0, 0), 3, [(0, 0), (0, 1), (0, 2)], Position(0, 3)),
    "to the epoch end": (4, 2, Position(0, 1), 3, [(0, 1), (0, 2), (0, 3)], Position(1, 0)),
    "across an epoch end": (4, 2, Position(0, 3), 3, [(0, 3), (1, 0), (1, 1)], Position(1, 2)),
    "short at the last end": (4, 2, Position(1, 2), 5, [(1, 2), (1, 3)], Position(2, 0)),
    "nothing when done": (4, 2, Position(2, 0), 5, [], Position(2, 0)),
    "nothing asked": (4, 2, Position(0, 1), 0, [], Position(0, 1)),
    "several epochs at once": (2, 3, Position(0, 1), 4, [(0, 1), (1, 0), (1, 1), (2, 0)], Position(2, 1)),
}  # fmt: skip


@pytest.mark.parametrize(("rows", "epochs", "pos", "count", "want", "after"), TAKES.values(), ids=list(TAKES))
def test_take(
    rows: int, epochs: int, pos: Position, count: int, want: list[tuple[int, int]], after: Position
) -> None:
    shuffle = feeding.Shuffle(rows, seed=3, epochs=epochs)
    slots, nxt = shuffle.take(pos, count)
    assert [(s.epoch, s.offset) for s in slots] == want
    assert [s.row for s in slots] == [shuffle.order(e)[o] for e, o in want]
    assert nxt == after


@given(
    rows=st.integers(1, 30), epochs=st.integers(1, 4), seed=st.integers(0, 2**31 - 1),
    chunks=st.lists(st.integers(1, 40), min_size=1, max_size=5),
)  # fmt: skip
def test_every_row_once_per_epoch_whatever_the_chunks(
    rows: int, epochs: int, seed: int, chunks: list[int]
) -> None:
    shuffle = feeding.Shuffle(rows, seed=seed, epochs=epochs)
    got = feeding.run_to_completion(shuffle, chunks)
    assert got == feeding.run_to_completion(feeding.Shuffle(rows, seed=seed, epochs=epochs), [1])
    for epoch in range(epochs):
        assert sorted(s.row for s in got if s.epoch == epoch) == list(range(rows))
    assert [s.epoch for s in got] == sorted(s.epoch for s in got)
    assert shuffle.fed(Position(epochs, 0)) == len(got) == rows * epochs


def test_a_resumed_position_continues_without_repeat_or_gap() -> None:
    """The restart case: a second Shuffle (a new process) resumed from a recorded position."""
    first = feeding.Shuffle(10, seed=5, epochs=2)
    before, pos = first.take(Position(), 7)
    after, _ = feeding.Shuffle(10, seed=5, epochs=2).take(pos, 13)
    assert [s.row for s in before + after if s.epoch == 0] == list(first.order(0))
    assert first.fed(pos) == 7


# (pending, target, members per task, weights) -> groups per task
WANTED = {
    "empty": (0, 16, [4], [1.0], [4]),
    "one short": (13, 16, [4], [1.0], [1]),
    "full": (16, 16, [4], [1.0], [0]),
    "over": (40, 16, [4], [1.0], [0]),
    "rounds up to whole groups": (0, 10, [4], [1.0], [3]),
    "no target": (0, 0, [4], [1.0], [0]),
    "two tasks by weight": (0, 32, [4, 8], [3.0, 1.0], [6, 1]),  # 24 and 8 trajectories
    "no tasks": (0, 16, [], [], []),
}  # fmt: skip


@pytest.mark.parametrize(
    ("pending", "target", "members", "weights", "want"), WANTED.values(), ids=list(WANTED)
)
def test_wanted_groups(
    pending: int, target: int, members: list[int], weights: list[float], want: list[int]
) -> None:
    assert feeding.wanted_groups(pending=pending, target=target, members=members, weights=weights) == want


@pytest.mark.parametrize(
    ("total", "weights", "want"),
    [(10, [1.0], [10]), (10, [1.0, 1.0], [5, 5]), (7, [1.0, 1.0], [4, 3]), (10, [3.0, 1.0], [8, 2]),
     (0, [1.0, 2.0], [0, 0]), (5, [], [])],
    ids=["one", "even", "odd: first gets the rest", "weighted", "nothing", "no tasks"],
)  # fmt: skip
def test_split(total: int, weights: list[float], want: list[int]) -> None:
    assert feeding.split(total, weights) == want


def test_slots_name_rows_of_the_epoch_order() -> None:
    shuffle = feeding.Shuffle(3, seed=1, epochs=1)
    slots, _ = shuffle.take(Position(), 3)
    assert slots == [Slot(0, i, row) for i, row in enumerate(shuffle.order(0))]
