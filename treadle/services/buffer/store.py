"""The storage interface behind the buffer, and its embedded in-memory backend (local mode).

``BufferService`` (``service.py``) drives any ``Store``: it takes the store's lock, reads the oldest
pending groups, asks ``treadle.policy.batching`` what to evict and what to batch, and applies that
plan through the store. ``redis_store.RedisStore`` is the cluster backend; both pass the same tests
(``tests/unit/dataplane/test_buffer_store.py`` and the integration suite).

State of a group: *pending* (members arriving or ready, not leased) -> *leased* under a batch id ->
deleted on ``ack``, or back to pending when the lease expires (redelivery). Evicted groups are
deleted and remembered, so a late member of an evicted group is counted, not stored. Every stored
trajectory id is remembered, so a repeated put is a counted duplicate (idempotent put).

The store also keeps the state of FlexMARL's micro-batch pipeline (``pipeline.MicroBatchPipeline``,
one JSON document the store does not read): ``lease``, ``ack`` and ``requeue_expired`` take the state
that follows them and store it in the same atomic step, or not at all when they refuse, so a
restarted buffer never sees a micro-batch released, trained or redelivered without the pipeline
knowing. Other changes (a step closing at the barrier, a rollout ending) go through
``save_pipeline``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Sequence
from typing import Protocol

from treadle.errors import NotFound, SpecError
from treadle.policy import batching
from treadle.services.buffer import protocol


@dataclasses.dataclass
class Counters:
    """Totals since start plus the current sizes; the same fields as ``BufferStats``."""

    stored: int = 0
    stored_groups: int = 0
    leased_batches: int = 0
    put: int = 0
    duplicates: int = 0
    completed: int = 0
    failed: int = 0
    aborted: int = 0
    delivered: int = 0
    acked: int = 0
    redelivered: int = 0
    evicted: int = 0
    retired_empty_groups: int = 0
    failed_by_reason: dict[str, int] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Leased:
    """Encoded completed trajectories of the leased groups, oldest group first."""

    payloads: list[bytes]


class Store(Protocol):
    async def put(self, records: Sequence[protocol.Record]) -> protocol.PutResult:
        """Store all records or none; ``SpecError`` when one disagrees with its stored group."""

    def lock(self) -> contextlib.AbstractAsyncContextManager[None]:
        """Held while a batch is formed, so two buffer replicas never lease the same group."""

    async def pending(self, limit: int, *, agent: str | None = None) -> tuple[list[batching.Group], bool]:
        """The ``limit`` oldest pending groups (of ``agent``'s table; None: every table), and whether
        more exist."""

    async def evict(self, group_ids: Sequence[str]) -> int:
        """Delete stale groups; returns how many trajectories went."""

    async def retire(self, group_ids: Sequence[str]) -> int:
        """Delete ready groups with no completed member."""

    async def lease(
        self, group_ids: Sequence[str], *, batch_id: str, deadline: float, pipeline: str | None = None
    ) -> Leased:
        """Move pending groups under ``batch_id`` until ``deadline`` (store clock, seconds)."""

    async def ack(self, batch_id: str, *, pipeline: str | None = None) -> int:
        """Delete a leased batch; ``NotFound`` for an unknown (or expired and redelivered) batch."""

    async def requeue_expired(self, now: float, *, pipeline: str | None = None) -> int:
        """Return groups of leases that ended before ``now`` to pending; how many groups."""

    async def pipeline_state(self) -> str | None:
        """The micro-batch pipeline's state last stored (None: never)."""

    async def save_pipeline(self, state: str) -> None: ...

    async def counters(self) -> Counters: ...

    async def aclose(self) -> None: ...


def member_error(
    index: int, record: protocol.Record, *, task: str, agent: str, expected: int, arrived: int
) -> SpecError:
    """The one message both backends give when a record disagrees with its stored group."""
    at = f"trajectories[{index}]"
    if task != record.task:
        return SpecError(f"group {record.group_id!r} is stored with task {task!r}", field=f"{at}.task")
    if agent != record.agent:
        return SpecError(f"group {record.group_id!r} is stored for agent {agent!r}", field=f"{at}.agent")
    if expected != record.group_size:
        return SpecError(
            f"group {record.group_id!r} is stored with group_size {expected}", field=f"{at}.group_size"
        )
    return SpecError(
        f"group {record.group_id!r} already has all {expected} members ({arrived} arrived)",
        field=f"{at}.group_id",
    )


@dataclasses.dataclass
class _Group:
    task: str
    agent: str
    expected: int
    seq: int
    min_version: int
    members: list[tuple[str, str]]  # (trajectory id, status), arrival order

    @property
    def completed(self) -> int:
        return sum(1 for _, status in self.members if status == "completed")


class MemoryStore:
    """Everything in this process's memory; for local mode and one buffer replica only."""

    def __init__(self) -> None:
        self._lock = asyncio.Lock()
        self._seq = 0
        self._payloads: dict[str, bytes] = {}
        self._groups: dict[str, _Group] = {}
        self._pending: set[str] = set()
        self._leases: dict[str, tuple[float, list[str]]] = {}
        self._seen: set[str] = set()
        self._gone: set[str] = set()
        self._pipeline: str | None = None
        self._c = Counters()

    async def put(self, records: Sequence[protocol.Record]) -> protocol.PutResult:
        fresh: list[protocol.Record] = []
        arriving: dict[str, int] = {}
        batch_ids: set[str] = set()
        for i, r in enumerate(records):
            if r.trajectory_id in self._seen or r.trajectory_id in batch_ids or r.group_id in self._gone:
                continue
            g = self._groups.get(r.group_id)
            task, agent, expected, arrived = (
                (g.task, g.agent, g.expected, len(g.members)) if g else (r.task, r.agent, r.group_size, 0)
            )
            n = arriving.get(r.group_id, arrived) + 1
            if task != r.task or agent != r.agent or expected != r.group_size or n > expected:
                raise member_error(i, r, task=task, agent=agent, expected=expected, arrived=n - 1)
            arriving[r.group_id] = n
            batch_ids.add(r.trajectory_id)
            fresh.append(r)
        late = 0
        for r in records:
            if r.group_id in self._gone and r.trajectory_id not in self._seen:
                late += 1
        for r in fresh:
            self._seen.add(r.trajectory_id)
            g = self._groups.get(r.group_id)
            if g is None:
                self._seq += 1
                g = self._groups[r.group_id] = _Group(
                    r.task, r.agent, r.group_size, self._seq, r.init_version, []
                )
                self._pending.add(r.group_id)
            g.min_version = min(g.min_version, r.init_version)
            g.members.append((r.trajectory_id, r.status))
            self._payloads[r.trajectory_id] = r.payload
            self._count_put(r)
        for r in records:
            if r.group_id in self._gone and r.trajectory_id not in self._seen:
                self._seen.add(r.trajectory_id)
        self._c.evicted += late
        stored = len(fresh)
        return protocol.PutResult(stored=stored, duplicates=len(records) - stored - late)

    def _count_put(self, r: protocol.Record) -> None:
        self._c.put += 1
        setattr(self._c, r.status, getattr(self._c, r.status) + 1)
        if r.status != "completed":
            self._c.failed_by_reason[r.reason] = self._c.failed_by_reason.get(r.reason, 0) + 1

    @contextlib.asynccontextmanager
    async def _locked(self) -> AsyncIterator[None]:
        async with self._lock:
            yield

    def lock(self) -> contextlib.AbstractAsyncContextManager[None]:
        return self._locked()

    async def pending(self, limit: int, *, agent: str | None = None) -> tuple[list[batching.Group], bool]:
        table = (
            self._pending if agent is None else {g for g in self._pending if self._groups[g].agent == agent}
        )
        order = sorted(table, key=lambda gid: self._groups[gid].seq)
        out = [self._summary(gid) for gid in order[:limit]]
        return out, len(order) > limit

    def _summary(self, gid: str) -> batching.Group:
        g = self._groups[gid]
        return batching.Group(gid, g.task, g.expected, g.seq, g.min_version, len(g.members), g.completed)

    def _delete(self, gid: str) -> int:
        g = self._groups.pop(gid)
        self._pending.discard(gid)
        for tid, _ in g.members:
            self._payloads.pop(tid, None)
        return len(g.members)

    async def evict(self, group_ids: Sequence[str]) -> int:
        n = 0
        for gid in group_ids:
            if gid in self._pending:
                n += self._delete(gid)
                self._gone.add(gid)
        self._c.evicted += n
        return n

    async def retire(self, group_ids: Sequence[str]) -> int:
        n = 0
        for gid in group_ids:
            if gid in self._pending:
                n += self._delete(gid)
                self._c.retired_empty_groups += 1
        return n

    async def lease(
        self, group_ids: Sequence[str], *, batch_id: str, deadline: float, pipeline: str | None = None
    ) -> Leased:
        payloads: list[bytes] = []
        for gid in group_ids:
            if gid not in self._pending:
                raise NotFound(f"group {gid!r} is not pending")
        if pipeline is not None:
            self._pipeline = pipeline
        for gid in group_ids:
            self._pending.discard(gid)
            for tid, status in self._groups[gid].members:
                if status == "completed":
                    payloads.append(self._payloads[tid])
        self._leases[batch_id] = (deadline, list(group_ids))
        self._c.delivered += len(payloads)
        return Leased(payloads=payloads)

    async def ack(self, batch_id: str, *, pipeline: str | None = None) -> int:
        lease = self._leases.pop(batch_id, None)
        if lease is None:
            raise NotFound(
                f"batch {batch_id!r} is not leased (unknown, already acked, or expired and redelivered)"
            )
        if pipeline is not None:
            self._pipeline = pipeline
        n = 0
        for gid in lease[1]:
            n += self._groups[gid].completed
            self._delete(gid)
        self._c.acked += n
        return n

    async def requeue_expired(self, now: float, *, pipeline: str | None = None) -> int:
        if pipeline is not None:
            self._pipeline = pipeline
        moved = 0
        for bid, (deadline, gids) in list(self._leases.items()):
            if deadline <= now:
                del self._leases[bid]
                for gid in gids:
                    self._pending.add(gid)
                    self._c.redelivered += self._groups[gid].completed
                moved += len(gids)
        return moved

    async def pipeline_state(self) -> str | None:
        return self._pipeline

    async def save_pipeline(self, state: str) -> None:
        self._pipeline = state

    async def counters(self) -> Counters:
        c = dataclasses.replace(self._c, failed_by_reason=dict(self._c.failed_by_reason))
        c.stored = len(self._payloads)
        c.stored_groups = len(self._groups)
        c.leased_batches = len(self._leases)
        return c

    async def aclose(self) -> None:
        return None
