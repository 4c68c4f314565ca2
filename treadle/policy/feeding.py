"""Which dataset rows a feeder submits next: a fixed shuffle per epoch, a position, a demand.

Called by the feeder service (``treadle.services.feeder``) on every tick, and by its tests.

Order. Epoch ``e`` feeds the ``n`` rows in the order ``permutation(n, seed=s, epoch=e)``: row
indices sorted by BLAKE2b(s, e, index). The hash alone fixes it, where a seeded RNG's stream may
change with the Python version; a feeder restarted mid-epoch after an upgrade must find the same
order, or it would repeat some rows of that epoch and skip others.

Position. ``Position(epoch, offset)``: the first ``offset`` rows of epoch ``epoch``'s order have been
taken. ``Shuffle.take(pos, k)`` returns the next ``k`` slots (epoch, offset, row), crossing epoch
ends, and the position after them; after ``epochs`` epochs it returns nothing (``done``).

Demand. The feeder tops up the scheduler's queue of trajectories waiting for admission to
``target``: ``wanted_groups`` splits ``target - pending`` between tasks by weight (``split``) and
rounds each share up to whole groups. Admission (``treadle.policy.admission``) still decides when a
group starts, so the staleness window stays the scheduler's alone.

Invariants (tests): over a whole run every (epoch, row) is taken exactly once, epochs in order;
taking in chunks of any sizes gives the same sequence (``run_to_completion``).

Seeds. A task without a dataset draws its prompts from its environment's seeds: ``Seeds`` takes
0, 1, 2, ... in order (the environment makes each seed's problem; seeds need no shuffle), as one
epoch without end: the job's trainer, or whoever consumes the batches, decides when it has enough.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Sequence


@dataclasses.dataclass(frozen=True, order=True)
class Position:
    epoch: int = 0
    offset: int = 0
    """Rows of ``epoch``'s order already taken."""


@dataclasses.dataclass(frozen=True)
class Slot:
    epoch: int
    offset: int
    row: int
    """Index of the row in the dataset."""


def permutation(rows: int, *, seed: int, epoch: int) -> tuple[int, ...]:
    """The order of epoch ``epoch``: row indices sorted by their keyed hash (ties: by index)."""
    key = f"{seed}:{epoch}:".encode()

    def rank(index: int) -> tuple[bytes, int]:
        return hashlib.blake2b(key + str(index).encode(), digest_size=8).digest(), index

    return tuple(sorted(range(rows), key=rank))


class Shuffle:
    """The feeding order of ``rows`` rows over ``epochs`` epochs; one epoch's permutation is kept."""

    def __init__(self, rows: int, *, seed: int, epochs: int) -> None:
        if rows < 1 or epochs < 1:
            raise ValueError(f"needs rows >= 1 and epochs >= 1, got {rows} and {epochs}")
        self.rows, self.seed, self.epochs = rows, seed, epochs
        self._cached: tuple[int, tuple[int, ...]] | None = None

    def order(self, epoch: int) -> tuple[int, ...]:
        if self._cached is None or self._cached[0] != epoch:
            self._cached = (epoch, permutation(self.rows, seed=self.seed, epoch=epoch))
        return self._cached[1]

    def done(self, pos: Position) -> bool:
        return pos.epoch >= self.epochs

    def take(self, pos: Position, count: int) -> tuple[list[Slot], Position]:
        """The next ``count`` slots from ``pos`` (fewer at the last epoch's end) and the position after."""
        slots: list[Slot] = []
        while len(slots) < count and not self.done(pos):
            order = self.order(pos.epoch)
            end = min(self.rows, pos.offset + count - len(slots))
            slots += [Slot(pos.epoch, offset, order[offset]) for offset in range(pos.offset, end)]
            pos = Position(pos.epoch + 1, 0) if end == self.rows else Position(pos.epoch, end)
        return slots, pos

    def fed(self, pos: Position) -> int:
        """Rows taken before ``pos`` over every epoch."""
        return min(pos.epoch, self.epochs) * self.rows + (0 if self.done(pos) else pos.offset)


class Seeds:
    """The feeding order of a task without a dataset: seeds 0, 1, 2, ... in one epoch without end;
    a slot's ``row`` is its seed."""

    rows = 0
    """No dataset rows."""

    def done(self, pos: Position) -> bool:
        return False

    def take(self, pos: Position, count: int) -> tuple[list[Slot], Position]:
        """The next ``count`` seeds from ``pos`` and the position after them."""
        end = pos.offset + max(count, 0)
        slots = [Slot(pos.epoch, offset, offset) for offset in range(pos.offset, end)]
        return slots, Position(pos.epoch, end)

    def fed(self, pos: Position) -> int:
        """Seeds taken before ``pos``."""
        return pos.offset


Order = Shuffle | Seeds
"""How a task's groups are drawn: a dataset's rows (``Shuffle``) or its environment's seeds (``Seeds``)."""


def wanted_groups(
    *, pending: int, target: int, members: Sequence[int], weights: Sequence[float]
) -> list[int]:
    """Groups per task that bring ``pending`` trajectories up to ``target``: the shortfall split by
    ``weights``, each task's share rounded up to whole groups of its ``members`` (none at or above)."""
    if min(members, default=1) < 1:
        raise ValueError(f"members must be >= 1, got {list(members)}")
    shares = split(target - pending, weights)
    return [math.ceil(share / m) for share, m in zip(shares, members, strict=True)]


def split(total: int, weights: Sequence[float]) -> list[int]:
    """``total`` split in proportion to ``weights`` (largest remainders get the rest; ties: first)."""
    if not weights or total <= 0:
        return [0] * len(weights)
    whole = sum(weights)
    exact = [total * w / whole for w in weights]
    out = [math.floor(x) for x in exact]
    by_remainder = sorted(range(len(weights)), key=lambda i: (out[i] - exact[i], i))
    for i in by_remainder[: total - sum(out)]:
        out[i] += 1
    return out


def run_to_completion(shuffle: Shuffle, chunks: Sequence[int], *, max_steps: int = 100_000) -> list[Slot]:
    """Take chunks of the given sizes (cycled) from the start until done; tests check the invariants."""
    if not chunks or min(chunks) < 1:
        raise ValueError(f"chunks must be positive sizes, got {list(chunks)}")
    pos, out = Position(), list[Slot]()
    for step in range(max_steps):
        if shuffle.done(pos):
            return out
        slots, pos = shuffle.take(pos, chunks[step % len(chunks)])
        out += slots
    raise RuntimeError(f"not done after {max_steps} steps")
