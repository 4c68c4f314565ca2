"""Training batches from the buffer, as plain Python a PyTorch trainer can consume.

Called by trainers (and the reference GRPO trainer) through ``Batches``: a thin async iterator over
the buffer service's ``GetBatch``/``Ack`` (``treadle.services.buffer.client.BufferClient``, or any
object with the same two methods). It converts each batch into ``TrainBatch`` (token ids, logprobs,
per-token policy versions, rewards, GRPO groups) and acknowledges a batch only when the trainer
asks for the next one, so a trainer that dies mid-step gets the batch redelivered after its lease.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable
from typing import Literal, Protocol

from treadle import errors
from treadle.client import retrying
from treadle.v1 import buffer_pb2, common_pb2


class BufferLike(Protocol):
    async def get_batch(
        self, *, batch_size: int, version: int, timeout_s: float, lease_s: float = 0.0
    ) -> buffer_pb2.Batch: ...

    async def ack(self, batch_id: str) -> int: ...


@dataclasses.dataclass(frozen=True)
class Turn:
    prompt_token_ids: tuple[int, ...]
    output_token_ids: tuple[int, ...]
    output_logprobs: tuple[float, ...]
    """Sampling logprob of each output token under the policy that generated it (may be empty)."""
    output_versions: tuple[int, ...]
    """Policy version of each output token; a turn that spans a weight swap carries two."""


@dataclasses.dataclass(frozen=True)
class Sample:
    """One trajectory."""

    trajectory_id: str
    group_id: str
    task: str
    reward: float
    init_version: int
    min_version: int
    max_version: int
    turns: tuple[Turn, ...]


@dataclasses.dataclass(frozen=True)
class TrainBatch:
    batch_id: str
    samples: tuple[Sample, ...]
    evicted_groups: int
    """Groups the buffer dropped as too stale while forming this batch."""

    @property
    def groups(self) -> dict[str, list[Sample]]:
        """Samples by GRPO group, in batch order."""
        out: dict[str, list[Sample]] = {}
        for s in self.samples:
            out.setdefault(s.group_id, []).append(s)
        return out

    @property
    def rewards(self) -> list[float]:
        return [s.reward for s in self.samples]


def from_proto(batch: buffer_pb2.Batch) -> TrainBatch:
    return TrainBatch(
        batch_id=batch.batch_id,
        samples=tuple(_sample(t) for t in batch.trajectories),
        evicted_groups=batch.evicted_groups,
    )


def _sample(t: common_pb2.Trajectory) -> Sample:
    return Sample(
        trajectory_id=t.trajectory_id, group_id=t.group_id, task=t.task, reward=t.reward,
        init_version=t.init_version, min_version=t.min_version, max_version=t.max_version,
        turns=tuple(
            Turn(tuple(u.prompt_token_ids), tuple(u.output_token_ids), tuple(u.output_logprobs),
                 tuple(u.output_versions))
            for u in t.turns
        ),
    )  # fmt: skip


class Batches:
    """``async for batch in Batches(...)``: staleness-bounded batches, acked one step later.

    ``version`` is read before every request (typically ``Publisher.committed``), so the buffer
    evicts groups older than ``version - alpha`` relative to what the trainer has committed.
    Iteration ends after ``max_batches`` (None: never); ``TimeoutError`` from the buffer propagates, and
    so does ``Unavailable`` once the buffer has not answered for ``restart_wait_s``.

    A batch is acked when the next one is asked for (``acks="on_next"``): right for a loop that
    commits each step's version before asking for the next batch. A trainer that asks for the next
    batch before committing (the reference trainer overlaps them) takes ``acks="explicit"`` and calls
    ``ack(batch_id)`` once the version trained on it is committed: a trainer killed in between gets
    the batch again after its lease instead of losing it.
    """

    def __init__(
        self,
        buffer: BufferLike,
        *,
        batch_size: int,
        version: Callable[[], int],
        timeout_s: float = 300.0,
        lease_s: float = 0.0,
        max_batches: int | None = None,
        restart_wait_s: float = 300.0,
        acks: Literal["on_next", "explicit"] = "on_next",
    ) -> None:
        if acks not in ("on_next", "explicit"):
            raise errors.SpecError("must be on_next or explicit", field="acks", value=acks)
        if batch_size < 1:
            raise errors.SpecError("must be >= 1", field="batch_size", value=batch_size)
        if max_batches is not None and max_batches < 0:
            raise errors.SpecError("must be >= 0", field="max_batches", value=max_batches)
        self._buffer = buffer
        self.batch_size = batch_size
        self._version = version
        self.timeout_s = timeout_s
        self.lease_s = lease_s
        self.max_batches = max_batches
        self.restart_wait_s = restart_wait_s
        """How long an unreachable buffer (``Unavailable``) is waited for before the error propagates."""
        self.acks = acks
        self.delivered = 0
        self._unacked: list[str] = []

    def __aiter__(self) -> AsyncIterator[TrainBatch]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[TrainBatch]:
        while self.max_batches is None or self.delivered < self.max_batches:
            if self.acks == "on_next":
                await self.ack()
            raw = await retrying.wait_for(
                lambda: self._buffer.get_batch(
                    batch_size=self.batch_size,
                    version=self._version(),
                    timeout_s=self.timeout_s,
                    lease_s=self.lease_s,
                ),
                what="the buffer (GetBatch)",
                timeout_s=self.restart_wait_s,
            )
            self._unacked.append(raw.batch_id)
            self.delivered += 1
            yield from_proto(raw)
        if self.acks == "on_next":
            await self.ack()

    async def ack(self, batch_id: str | None = None) -> None:
        """Acknowledge ``batch_id``, or (None) every batch handed out and not acked yet."""
        if batch_id is not None and batch_id not in self._unacked:
            raise errors.SpecError("not a batch handed out and unacked", field="batch_id", value=batch_id)
        for bid in [batch_id] if batch_id is not None else list(self._unacked):
            # A buffer restarting (its state is in Redis) is waited for: the batch stays unacked meanwhile,
            # and an ack that did land before an outage is answered again (acking is idempotent).
            await retrying.wait_for(
                lambda: self._buffer.ack(bid),  # noqa: B023
                what="the buffer (Ack)",
                timeout_s=self.restart_wait_s,
            )
            self._unacked.remove(bid)
