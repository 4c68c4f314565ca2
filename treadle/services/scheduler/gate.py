"""The gate of the scheduler's turn loop: bounds concurrent generations and orders the waiting turns.

Used by ``turns.TurnLoop`` around every generation; the order of waiting turns is the scheduling
policy named in the job (``treadle.policy.registry``) and the choice of preemption victims is
``treadle.policy.preemption``'s.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import math
import time
from collections.abc import Callable

from treadle import errors
from treadle.policy import preemption, registry

TYPICAL_TURN_WEIGHT = 0.1
"""Weight of each finished turn in the gate's running mean of turn time (preemption's progress)."""


class Gate:
    """Bounds concurrent generations, holds turns while suspended, and orders the waiting ones.

    Slots are counted per ``key``: one key ("") for the whole scheduler by default, or the worker
    id (``Settings.worker_slots``), when each worker has its own queue, as in Heddle where
    progressive priority reorders every rollout worker's pending queue.

    With ``preempt`` set (a policy in ``registry.PREEMPTIVE_SCHEDULING``), a waiting turn that
    outranks a running one of the same key while its slots are taken has the running one preempted
    (``preemption.victims``): ``preempt(tid)`` ABORTs it on its worker, its generation comes back
    aborted, its slot is released and it queues again with its turn. Only turns that have run at
    most ``max_progress`` of a typical turn (the running mean of the turns that finished here, by
    ``clock``) are victims: the aborted turn's tokens are thrown away, so that bounds the waste.
    """

    def __init__(
        self,
        limit: int,
        policy: registry.SchedulingPolicy,
        *,
        preempt: Callable[[str], None] | None = None,
        margin: float = 0.0,
        max_progress: float = math.inf,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not max_progress >= 0:
            raise errors.SpecError("must be >= 0", field="preemption_max_progress", value=max_progress)
        self.limit = limit
        self.policy = policy
        self.preempt = preempt
        self.margin = margin
        self.max_progress = max_progress
        self.clock = clock
        self._started: dict[str, float] = {}
        self._typical_turn_s = 0.0
        """Exponential mean of finished (not preempted) turns' slot time; 0 until one finishes."""
        self.suspended = False
        self._seq = itertools.count()
        self._waiting: dict[str, tuple[registry.QueuedTurn, asyncio.Future[None], str]] = {}
        self._running: dict[str, tuple[registry.QueuedTurn, str]] = {}
        self._active: collections.Counter[str] = collections.Counter()
        self._stopping: set[str] = set()

    @property
    def active(self) -> int:
        return len(self._running)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def state(self, tid: str) -> str:
        """``generating``, ``waiting`` or ``""`` (neither: in the environment, reward or admission)."""
        return "generating" if tid in self._running else "waiting" if tid in self._waiting else ""

    async def acquire(
        self, tid: str, *, turn: int, task: str, predicted_remaining: float = 0.0, tokens_so_far: int = 0,
        key: str = "",
    ) -> None:  # fmt: skip
        queued = registry.QueuedTurn(tid, next(self._seq), turn, task, predicted_remaining, tokens_so_far)
        if not self.suspended and self._active[key] < self.limit and not self._waits(key):
            self._start(tid, queued, key)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting[tid] = (queued, fut, key)
        try:
            self.wake(key)
            await fut
        except asyncio.CancelledError:
            self._waiting.pop(tid, None)
            if fut.done() and not fut.cancelled():
                self.release(tid)  # the slot was granted just as we were cancelled
            raise

    def release(self, tid: str) -> None:
        if tid not in self._running:
            return  # never granted (or released already): no slot to give back
        _, key = self._running.pop(tid)
        self._active[key] -= 1
        if self._active[key] <= 0:
            del self._active[key]
        held = self.clock() - self._started.pop(tid)
        if tid not in self._stopping:  # a preempted turn's time says nothing about a whole turn's
            mean = self._typical_turn_s
            self._typical_turn_s = held if mean == 0.0 else mean + TYPICAL_TURN_WEIGHT * (held - mean)
        self._stopping.discard(tid)
        self.wake(key)

    def wake(self, key: str | None = None) -> None:
        """Grant free slots in policy order (of ``key``, or of every key) and preempt where it pays."""
        if self.suspended or not self._waiting:
            return
        keys = {k for _, _, k in self._waiting.values()} if key is None else {key}
        for k in sorted(keys):
            self._wake(k)

    def _wake(self, key: str) -> None:
        waiting = [q for q, _, k in self._waiting.values() if k == key]
        free = self.limit - self._active[key]
        if free > 0 and waiting:
            granted = set(self.policy(waiting)[:free])
            for tid in granted:
                queued, fut, _ = self._waiting.pop(tid)
                self._start(tid, queued, key)
                fut.set_result(None)
            waiting = [q for q in waiting if q.trajectory_id not in granted]
        if self.preempt is None or not waiting:
            return
        running = [q for q, k in self._running.values() if k == key]
        stopping = {tid for tid in self._stopping if self._running[tid][1] == key}
        progress = {}
        if self._typical_turn_s > 0:
            now = self.clock()
            progress = {q.trajectory_id: (now - self._started[q.trajectory_id]) / self._typical_turn_s
                        for q in running}  # fmt: skip
        for tid in preemption.victims(
            running, waiting, slots=self.limit, stopping=stopping, margin=self.margin, progress=progress,
            max_progress=self.max_progress,
        ):  # fmt: skip
            self._stopping.add(tid)
            self.preempt(tid)

    def _start(self, tid: str, queued: registry.QueuedTurn, key: str) -> None:
        self._started[tid] = self.clock()
        self._running[tid] = (queued, key)
        self._active[key] += 1

    def _waits(self, key: str) -> bool:
        return any(k == key for _, _, k in self._waiting.values())
