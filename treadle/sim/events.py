"""Simulator events: what happens, when, to whom; and the order of events at the same instant.

Created by the handlers of ``treadle.sim.engine`` (each handler returns its follow-up events) and
ordered by ``Queue``, whose heap key is SimPy's ``(time, kind order, per-run sequence)``: one total
order, reproducible across runs and processes, with no class-level counters.
"""

from __future__ import annotations

import dataclasses
import enum
import heapq
import itertools
from collections.abc import Iterable


class Kind(enum.IntEnum):
    """Event kinds; the value is the order among events at the same time (smaller first).

    Completions come before new work so that a slot freed at time t is visible to work arriving
    at t; the trainer's ``get_batch`` comes last so it sees every trajectory scored at t.
    """

    WORKER = 1
    """A worker's prefill batch, decode completion or weight load is due (``subject`` = worker)."""
    TOOL_DONE = 2
    """An environment step finished (``subject`` = trajectory)."""
    RESET_DONE = 3
    """An environment reset finished (``subject`` = trajectory)."""
    REWARD_DONE = 4
    """A trajectory was scored (``subject`` = trajectory)."""
    TRAIN_DONE = 5
    """The trainer finished a step (``subject`` = step number)."""
    PUSH_DONE = 6
    """The trained weights reached the weight store (``subject`` = version)."""
    ADMIT = 7
    """The scheduler may start new groups."""
    GET_BATCH = 8
    """The trainer tries to form a batch."""
    MIGRATION_DONE = 9
    """A trajectory's KV cache reached its new worker (``subject`` = trajectory; Heddle §5.3)."""
    POLL = 10
    """A periodic controller poll (``subject`` = which; FlexMARL's rebalancing)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Event:
    time: float
    kind: Kind
    subject: int = 0
    token: int = 0
    """Validity stamp: a handler ignores an event whose token no longer matches its subject's
    (the worker's schedule or the trajectory's life changed since it was scheduled)."""


class Queue:
    """The event heap of one run."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, int, Event]] = []
        self._seq = itertools.count()

    def push(self, event: Event) -> None:
        heapq.heappush(self._heap, (event.time, int(event.kind), next(self._seq), event))

    def push_all(self, events: Iterable[Event]) -> None:
        for event in events:
            self.push(event)

    def pop(self) -> Event:
        return heapq.heappop(self._heap)[3]

    def __len__(self) -> int:
        return len(self._heap)
