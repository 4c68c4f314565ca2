"""Where the scheduler keeps each DARTS task's length statistics, so they outlive a restart.

Used by ``darts.Darts``: ``load`` once before the first plan, ``save`` after every step. One
``treadle.policy.darts.stats.Stats`` per task, as its JSON (``stats.to_json``): per-prompt variances,
the dataset window and the last step's lengths.

* ``RedisStats``: one string per task, ``treadle:darts:{<namespace>}:<task>``, written whole by one
  ``SET`` (atomic), so a restarted scheduler reads either the last step's statistics or the one
  before, never a mix. The namespace is the job's key prefix (``TREADLE_KEY_PREFIX``, the buffer's
  and the feeder's), so two jobs on one Redis never share statistics.
* ``MemoryStats``: local mode without Redis; gone with the process.
"""

from __future__ import annotations

from typing import Protocol

import redis.asyncio as aioredis

from treadle.policy.darts import stats


class StatsStore(Protocol):
    async def load(self, task: str) -> stats.Stats | None:
        """The task's saved statistics; ``None`` if none were saved."""

    async def save(self, task: str, state: stats.Stats) -> None: ...

    async def aclose(self) -> None: ...


class MemoryStats:
    def __init__(self) -> None:
        self.saved: dict[str, str] = {}

    async def load(self, task: str) -> stats.Stats | None:
        text = self.saved.get(task)
        return stats.from_json(text) if text is not None else None

    async def save(self, task: str, state: stats.Stats) -> None:
        self.saved[task] = stats.to_json(state)

    async def aclose(self) -> None:
        return None


class RedisStats:
    def __init__(self, client: aioredis.Redis, *, namespace: str) -> None:
        self._r, self.namespace = client, namespace

    @classmethod
    def from_url(cls, url: str, *, namespace: str) -> RedisStats:
        return cls(aioredis.Redis.from_url(url), namespace=namespace)

    def key(self, task: str) -> str:
        return f"treadle:darts:{{{self.namespace}}}:{task}"

    async def load(self, task: str) -> stats.Stats | None:
        raw = await self._r.get(self.key(task))
        if raw is None:
            return None
        return stats.from_json(raw.decode() if isinstance(raw, bytes) else str(raw))

    async def save(self, task: str, state: stats.Stats) -> None:
        await self._r.set(self.key(task), stats.to_json(state))

    async def aclose(self) -> None:
        await self._r.aclose()
