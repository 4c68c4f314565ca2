"""The stream of stored trajectories' results to every subscriber (``SchedulerService.results``)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from treadle.services.scheduler import protocol


class Results:
    def __init__(self) -> None:
        self._subscribers: set[asyncio.Queue[protocol.TrajectoryResult | None]] = set()

    def subscribe(self, *, max_queue: int) -> AsyncIterator[protocol.TrajectoryResult]:
        """Every result published from this call on; ends at ``close``.

        Subscribes at the call, not at the first iteration, so nothing published in between is missed.
        """
        queue: asyncio.Queue[protocol.TrajectoryResult | None] = asyncio.Queue(max_queue)
        self._subscribers.add(queue)
        return self._drain(queue)

    def publish(self, result: protocol.TrajectoryResult) -> None:
        for q in list(self._subscribers):
            try:
                q.put_nowait(result)
            except asyncio.QueueFull:
                # A subscriber this far behind is dropped rather than growing memory without bound.
                self._subscribers.discard(q)
                with contextlib.suppress(asyncio.QueueEmpty):
                    q.get_nowait()
                q.put_nowait(None)

    def close(self) -> None:
        for q in self._subscribers:
            with contextlib.suppress(asyncio.QueueFull):
                q.put_nowait(None)

    async def _drain(
        self, queue: asyncio.Queue[protocol.TrajectoryResult | None]
    ) -> AsyncIterator[protocol.TrajectoryResult]:
        try:
            while (item := await queue.get()) is not None:
                yield item
        finally:
            self._subscribers.discard(queue)
