"""The feeder's durable position in Redis: one hash per (job, task, dataset), written in one command.

Used by ``service.FeederService``. Record-then-submit: before submitting a batch the feeder writes,
in one ``HSET`` (atomic in Redis), the position after the batch *and* the batch itself (its start
and size, from which ``feeding.Shuffle`` rebuilds the same groups), marked unacknowledged. After
the scheduler accepts it, ``ack`` marks it acknowledged. A feeder that died in between finds the
batch unacknowledged and submits it again: group ids are ``<task>:e<epoch>:<row id>`` and the
scheduler ignores ids it already has, so a batch that did arrive is not fed twice, and one that did
not is not lost.

Key: ``treadle:feed:{<namespace>}:<task>:<dataset digest>``. The digest covers the rows, so a changed
dataset starts from epoch 0 under a new key instead of resuming a position that meant other rows.
"""

from __future__ import annotations

import dataclasses

import redis.asyncio as aioredis
from redis import typing as redis_typing

from treadle.policy import feeding


@dataclasses.dataclass(frozen=True)
class Record:
    position: feeding.Position
    """Where the next batch starts."""
    batch: feeding.Position
    """Where the last recorded batch started."""
    batch_size: int
    acked: bool
    """The scheduler accepted the last batch."""


class PositionStore:
    def __init__(self, client: aioredis.Redis, key: str) -> None:
        self._r, self.key = client, key

    async def load(self) -> Record | None:
        raw = {_text(k): int(v) for k, v in (await self._r.hgetall(self.key)).items()}
        if not raw:
            return None
        return Record(
            position=feeding.Position(raw["epoch"], raw["offset"]),
            batch=feeding.Position(raw["batch_epoch"], raw["batch_offset"]),
            batch_size=raw["batch_size"], acked=bool(raw["acked"]),
        )  # fmt: skip

    async def record(self, batch: feeding.Position, size: int, position: feeding.Position) -> None:
        """The batch about to be submitted and the position after it, unacknowledged, in one write."""
        mapping: dict[redis_typing.FieldT, redis_typing.EncodableT] = {
            "epoch": position.epoch, "offset": position.offset, "batch_epoch": batch.epoch,
            "batch_offset": batch.offset, "batch_size": size, "acked": 0,
        }  # fmt: skip
        await self._r.hset(self.key, mapping=mapping)

    async def ack(self) -> None:
        await self._r.hset(self.key, "acked", 1)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def key(namespace: str, task: str, digest: str) -> str:
    return f"treadle:feed:{{{namespace}}}:{task}:{digest}"
