"""Buffer logic: validate, store, and form staleness-bounded batches of whole groups.

Built by ``grpc_server.build_server`` (and directly by local mode and the tests) around one
``store.Store``. ``get_batch`` blocks: it tries to form a batch, and if it cannot, waits for the next
put through this service or ``poll_s`` (puts through other replicas and lease expiries have no
signal here), until ``timeout_s``. Each attempt, under the store's lock: requeue expired leases,
read the oldest pending groups, evict the stale ones and retire the empty ones
(``treadle.policy.batching``), plan, lease. A trainer that dies before ``ack`` loses nothing: the
lease expires and the groups are delivered again.

FlexMARL (``pipeline.MicroBatchPipeline`` over ``treadle.policy.flexmarl.pipeline``): each stored
group belongs to one agent's experience table (the trajectories' ``agent``); ``get_batch`` and
``stream_batch`` read one table or all. ``stream_batch`` releases an agent's micro-batches as its
ready samples reach the threshold, ``ack`` counts them as trained, and ``await_update`` is the
global barrier that answers every agent's trainer once all of them are through the step.

The pipeline's state lives in the store, not only here: every change is made on a copy under
``_pipeline_lock`` and kept once the store has taken it, atomically with the lease, ack or requeue it
goes with. A buffer rebuilt on the same Redis loads it at its first pipeline call, so trainers that
reconnect ack what they were given, stream the rest of the step and get its one update.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence

import prometheus_client as prom

from treadle import metrics
from treadle.policy import batching
from treadle.services.buffer import pipeline, protocol, store
from treadle.v1 import buffer_pb2, common_pb2

READY_SCAN = 100_000
"""Pending groups of one agent read at most to count its ready samples."""
MIN_SCAN = 16
"""Pending groups read per attempt at least. The first scan reads ``max(MIN_SCAN, size // 4)`` groups
(twice what groups of 8 need) and widens by 4x while no batch forms and more groups exist."""


class BufferMetrics:
    def __init__(self, registry: prom.CollectorRegistry) -> None:
        self.stored = prom.Gauge(
            metrics.BUFFER_STORED, "Trajectories stored and not yet acked", registry=registry
        )
        self.put = prom.Counter(
            metrics.BUFFER_PUT_TOTAL, "Trajectories put, by status", ["status"], registry=registry
        )
        self.delivered = prom.Counter(
            metrics.BUFFER_DELIVERED_TOTAL, "Trajectories delivered", registry=registry
        )
        self.evicted = prom.Counter(
            metrics.BUFFER_EVICTED_TOTAL, "Trajectories evicted as stale", registry=registry
        )
        self.staleness = prom.Histogram(
            metrics.BUFFER_STALENESS,
            "Trainer version minus init version of each delivered trajectory",
            buckets=(0, 1, 2, 3, 4, 6, 8, 16),
            registry=registry,
        )


class BufferService:
    def __init__(
        self,
        *,
        store: store.Store,
        alpha: int,
        task_weights: Mapping[str, float] | None = None,
        agents: Sequence[str] = (),
        default_lease_s: float = 300.0,
        max_trajectory_bytes: int = protocol.DEFAULT_MAX_TRAJECTORY_BYTES,
        poll_s: float = 0.05,
        clock: Callable[[], float] = time.time,
        registry: prom.CollectorRegistry | None = None,
    ) -> None:
        if task_weights:
            batching.quotas(1, task_weights)  # rejects negative or all-zero weights now, not at first batch
        self.store = store
        self.alpha = alpha
        self.task_weights = dict(task_weights or {})
        self.default_lease_s = default_lease_s
        self.max_trajectory_bytes = max_trajectory_bytes
        self.poll_s = poll_s
        self.clock = clock
        self.registry = registry or prom.CollectorRegistry()
        self.metrics = BufferMetrics(self.registry)
        self.pipeline = pipeline.MicroBatchPipeline(agents)
        self._pipeline_loaded = False
        self._pipeline_lock = asyncio.Lock()
        self._changed = asyncio.Event()

    async def put(self, trajectories: Sequence[common_pb2.Trajectory]) -> protocol.PutResult:
        records = protocol.to_records(trajectories, max_bytes=self.max_trajectory_bytes)
        result = await self.store.put(records)
        for status, n in collections.Counter(r.status for r in records).items():
            self.metrics.put.labels(status).inc(n)
        self._wake()
        return result

    def _wake(self) -> None:
        # Wake every waiter (get_batch, stream_batch, await_update); each waits on the event it saw
        # before its attempt.
        self._changed.set()
        self._changed = asyncio.Event()

    async def get_batch(
        self, *, batch_size: int, version: int, timeout_s: float, lease_s: float = 0.0, agent: str = ""
    ) -> buffer_pb2.Batch:
        """A batch of whole groups from ``agent``'s table (empty: every table)."""
        protocol.check_batch_request(
            batch_size=batch_size, timeout_s=timeout_s, lease_s=lease_s, micro_batch_size=None, agent=agent
        )
        return await self._wait_for(
            batch_size, version=version, timeout_s=timeout_s, lease_s=lease_s, agent=agent or None
        )

    async def stream_batch(
        self, *, batch_size: int, micro_batch_size: int, version: int, timeout_s: float, lease_s: float = 0.0,
        agent: str = "",
    ) -> AsyncIterator[buffer_pb2.Batch]:  # fmt: skip
        """``agent``'s micro-batches of this pipeline step, released by FlexMARL's rule.

        ``batch_size`` is the agent's target this step. When no micro-batch fills within ``timeout_s``
        the agent's rollout counts as done: the ready rest goes out as a tail and the stream ends
        (``TimeoutError`` if nothing was sent at all).
        """
        protocol.check_batch_request(
            batch_size=batch_size, timeout_s=timeout_s, lease_s=lease_s, micro_batch_size=micro_batch_size,
            agent=agent,
        )  # fmt: skip
        async with self.store.lock():  # a trainer streaming again gets what it lost when its lease ended
            await self._requeue_expired(self.clock())
        async with self._changing() as p:
            p.begin(agent, target=batch_size)
            await self.store.save_pipeline(p.dump())
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not self.pipeline.finished(agent):
            changed = self._changed
            ready = await self._ready(agent, version=version)
            release = self.pipeline.next_release(agent, ready=ready, micro_batch=micro_batch_size)
            micro = None
            if release is not None:
                micro = await self.try_take(
                    release.samples, version=version, lease_s=lease_s, agent=agent or None, release_to=agent
                )
            if micro is not None:
                n = len(micro.trajectories)
                micro.agent = agent
                micro.loss_scale = n / batch_size
                micro.last = self.pipeline.finished(agent)
                yield micro
                deadline = loop.time() + timeout_s
                continue
            state = self.pipeline.states.get(agent)
            if state is None or state.rollout_done:
                break
            left = deadline - loop.time()
            if left <= 0:
                async with self._changing() as p:
                    p.rollout_done(agent)  # the tail, if any, goes on the next pass
                    await self.store.save_pipeline(p.dump())
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), timeout=min(self.poll_s, left))
        state = self.pipeline.states.get(agent)
        if state is not None and state.released == 0:
            raise TimeoutError(f"no micro-batch of agent {agent!r} filled within {timeout_s}s")

    async def _ready(self, agent: str, *, version: int) -> int:
        """Completed samples of ``agent``'s ready, fresh groups (what the release rule counts)."""
        groups, _ = await self.store.pending(READY_SCAN, agent=agent or None)
        stale = set(batching.stale_groups(groups, version=version, alpha=self.alpha))
        return sum(g.completed for g in groups if g.group_id not in stale and batching.is_ready(g))

    async def ack(self, batch_id: str) -> int:
        protocol.check_batch_id(batch_id)
        async with self._changing() as p:
            ours = batch_id in p.batches
            p.acked(batch_id)
            closed = p.try_update() is not None
            n = await self.store.ack(batch_id, pipeline=p.dump() if ours or closed else None)
        self._wake()
        return n

    @contextlib.asynccontextmanager
    async def _changing(self) -> AsyncIterator[pipeline.MicroBatchPipeline]:
        """A copy of the pipeline state to change and hand to the store; it replaces the state only
        if the block completes (the store took it), so a refused call changes nothing."""
        async with self._pipeline_lock:
            if not self._pipeline_loaded:
                saved = await self.store.pipeline_state()
                if saved is not None:
                    self.pipeline = pipeline.load(saved, agents=self.pipeline.agents)
                self._pipeline_loaded = True
            after = self.pipeline.copy()
            yield after
            self.pipeline = after

    async def await_update(self, *, agent: str, timeout_s: float) -> buffer_pb2.UnifiedUpdate:
        """Block until the step ``agent`` is in closes (every agent through it); its update."""
        protocol.check_batch_request(
            batch_size=1, timeout_s=timeout_s, lease_s=0.0, micro_batch_size=None, agent=agent
        )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            changed = self._changed
            async with self._changing() as p:
                if p.try_update() is not None:
                    await self.store.save_pipeline(p.dump())
            step, update = self.pipeline.update_for(agent)
            if update is not None:
                return buffer_pb2.UnifiedUpdate(
                    step=step,
                    rescale=[buffer_pb2.AgentRescale(agent=a, factor=f) for a, f in update.rescale],
                )
            left = deadline - loop.time()
            if left <= 0:
                short = sorted(a for a, st in self.pipeline.states.items() if st.trained < st.target)
                raise TimeoutError(f"step {step} not closed within {timeout_s}s; agents short: {short}")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), timeout=min(self.poll_s, left))

    async def stats(self) -> buffer_pb2.BufferStats:
        c = await self.store.counters()
        self.metrics.stored.set(c.stored)
        return buffer_pb2.BufferStats(
            stored=c.stored,
            stored_groups=c.stored_groups,
            leased_batches=c.leased_batches,
            put=c.put,
            duplicates=c.duplicates,
            completed=c.completed,
            failed=c.failed,
            aborted=c.aborted,
            delivered=c.delivered,
            acked=c.acked,
            redelivered=c.redelivered,
            evicted=c.evicted,
            retired_empty_groups=c.retired_empty_groups,
            failed_by_reason=c.failed_by_reason,
        )

    async def _wait_for(
        self, size: int, *, version: int, timeout_s: float, lease_s: float, agent: str | None
    ) -> buffer_pb2.Batch:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            changed = self._changed
            batch = await self.try_take(size, version=version, lease_s=lease_s, agent=agent)
            if batch is not None:
                return batch
            left = deadline - loop.time()
            if left <= 0:
                raise TimeoutError(f"no batch of {size} completed trajectories within {timeout_s}s")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), timeout=min(self.poll_s, left))

    async def _requeue_expired(self, now: float) -> None:
        """Under the store's lock: leases ended by ``now`` go back to pending, and the pipeline's
        micro-batches among them count as not released."""
        async with self._changing() as p:
            expired = p.expire(now)
            await self.store.requeue_expired(now, pipeline=p.dump() if expired else None)

    async def try_take(
        self, size: int, *, version: int, lease_s: float = 0.0, agent: str | None = None,
        release_to: str | None = None,
    ) -> buffer_pb2.Batch | None:  # fmt: skip
        """One attempt to form and lease a batch of ``size`` from ``agent``'s table (None: all);
        ``release_to``: the batch is that pipeline agent's micro-batch."""
        evicted = 0
        async with self.store.lock():
            now = self.clock()
            await self._requeue_expired(now)
            limit = max(MIN_SCAN, size // 4)
            while True:
                groups, more = await self.store.pending(limit, agent=agent)
                stale = batching.stale_groups(groups, version=version, alpha=self.alpha)
                if stale:
                    n = await self.store.evict(stale)
                    evicted += len(stale)
                    self.metrics.evicted.inc(n)
                live = [g for g in groups if g.group_id not in set(stale)]
                empty = batching.empty_groups(live)
                if empty:
                    await self.store.retire(empty)
                plan = batching.plan_batch(live, batch_size=size, task_weights=self.task_weights or None)
                if plan is not None or not more:
                    break
                limit *= 4
            if plan is None:
                return None
            batch_id = uuid.uuid4().hex
            deadline = now + (lease_s or self.default_lease_s)
            if release_to is None:
                leased = await self.store.lease(plan, batch_id=batch_id, deadline=deadline)
            else:
                planned = set(plan)
                samples = sum(g.completed for g in live if g.group_id in planned)
                async with self._changing() as p:
                    if release_to not in p.states:
                        return None  # the step closed while this micro-batch was formed: it stays stored
                    p.released(release_to, batch_id=batch_id, samples=samples, deadline=deadline)
                    leased = await self.store.lease(
                        plan, batch_id=batch_id, deadline=deadline, pipeline=p.dump()
                    )
        self.metrics.delivered.inc(len(leased.payloads))
        batch = buffer_pb2.Batch(batch_id=batch_id, group_ids=plan, evicted_groups=evicted)
        for payload in leased.payloads:
            t = batch.trajectories.add()
            t.ParseFromString(payload)
            self.metrics.staleness.observe(max(0, version - t.init_version))
        return batch
