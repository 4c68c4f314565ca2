"""The reward gateway's GPU manager (ARL-Tangram §5.3, live): reward models on the gateway's own GPUs.

A task whose reward is ``judge:<name>`` is graded by the reward model ``<name>`` of
``spec.externalResources.rewardModels``. Every grading is one *action*: it waits in one FCFS queue;
on every arrival and completion the manager runs ``treadle.policy.tangram.schedule.decide`` (Alg. 1
with Alg. 2) over the queue, the actions running and the free GPUs as a ``pools.ChunkPool`` (Alg. 4's
view), and ``buddy.allocate`` places each grant on an aligned chunk of 1/2/4/8 GPUs, preferring one
where that variant (the model at that degree of parallelism, ``judge@tp2``) is still resident. A
granted chunk serves that one action (at most one action per GPU). A variant not resident there is
*restored from host memory*: the manager keeps every model's weights in host memory (the backup) and
copies the shard of each GPU of the chunk from it, evicting the least recently used variants on
those GPUs first until the new one fits (eviction is free: GPU state is never written back).

Durations and elasticity are profiled per model (``profile.KindProfile`` over its ``parallelism``):
first the largest degree, then the smallest, then the fitted curve decides, as the CPU manager does.

Engines (``engines``): real vLLM or simulated, chosen by the models' ``engine``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import time
from collections.abc import AsyncIterator, Callable, Sequence

import httpx
import prometheus_client

from treadle import errors, metrics
from treadle.api import v1alpha1
from treadle.policy.tangram import buddy, model, pools, profile, schedule
from treadle.sandbox import cores
from treadle.services.reward.engines import FIELD, FOOTPRINT, Engines, variant

GPU = "gpu"
SETTINGS = schedule.Settings(depth=schedule.DEFAULT_DEPTH, horizon=64)


def fits(rm: v1alpha1.RewardModel, degree: int, gpu_gb: float) -> bool:
    """Whether ``rm``'s shard at ``degree`` fits one GPU of ``gpu_gb`` (with ``FOOTPRINT``)."""
    return rm.weights_gb / degree * FOOTPRINT <= gpu_gb


@dataclasses.dataclass(frozen=True)
class Lease:
    """One action's grant: the variant, its chunk and engine, and what its start cost."""

    model: str
    degree: int
    chunk: buddy.Chunk
    client: httpx.AsyncClient
    queued_s: float
    restore_s: float
    """0 when the variant was resident (cache affinity hit)."""
    served: str | None
    """The ``model`` its requests name (``Engines.served_name``)."""


@dataclasses.dataclass(eq=False)
class _Request:
    action: model.Action
    name: str
    since: float
    future: asyncio.Future[tuple[buddy.Placement, int, float]]


class GpuManager:
    """Grants aligned GPU chunks to reward-model actions in FCFS order (module doc)."""

    def __init__(
        self,
        models: Sequence[v1alpha1.RewardModel],
        *,
        gpus: int,
        gpu_gb: float,
        engines: Engines,
        registry: prometheus_client.CollectorRegistry,
        action_metrics: cores.ActionMetrics,
        settings: schedule.Settings = SETTINGS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        for i, rm in enumerate(models):
            least = rm.weights_gb / max(rm.parallelism) * FOOTPRINT
            if not fits(rm, max(rm.parallelism), gpu_gb):
                raise errors.SpecError(
                    f"{rm.name} needs {least:.1f} GB per GPU even at degree {max(rm.parallelism)}, more "
                    f"than rewardModelGpuMemoryGb ({gpu_gb})",
                    field=f"{FIELD}[{i}].weightsGb", value=rm.weights_gb,
                )  # fmt: skip
        self.models = {m.name: m for m in models}
        self.pool = buddy.of_gpus(gpus, gpu_gb)
        self.total, self.engines, self.settings, self.clock = gpus, engines, settings, clock
        # A degree whose shard does not fit one GPU is never granted (a TP1 70B judge on 80 GB GPUs).
        self.profiles = {
            m.name: profile.KindProfile(GPU, tuple(sorted({k for k in m.parallelism if fits(m, k, gpu_gb)})))
            for m in models
        }
        self.action_metrics = action_metrics
        self._waiting: list[_Request] = []
        self._running: dict[buddy.Chunk, tuple[int, float, float]] = {}
        """Chunk -> (degree, started, expected seconds)."""
        self._ids = itertools.count()
        self._restores = prometheus_client.Counter(
            metrics.REWARD_MODEL_RESTORES_TOTAL, "Reward-model variants restored from host memory", ["model"],
            registry=registry,
        )  # fmt: skip
        self._evictions = prometheus_client.Counter(
            metrics.REWARD_MODEL_EVICTIONS_TOTAL, "Resident variants evicted (least recently used)",
            ["model"], registry=registry,
        )  # fmt: skip
        self._restore_s = prometheus_client.Histogram(
            metrics.REWARD_MODEL_RESTORE_SECONDS, "Restore of a variant from host memory", ["model"],
            registry=registry, buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60),
        )  # fmt: skip
        self._busy = prometheus_client.Gauge(
            metrics.REWARD_MODEL_GPUS_BUSY, "Reward-model GPUs serving an action", registry=registry
        )
        for name in self.models:
            for m in (self._restores, self._evictions, self._restore_s):
                m.labels(name)

    @property
    def free_gpus(self) -> int:
        return sum(c.size for c in self.pool.free)

    @contextlib.asynccontextmanager
    async def lease(self, name: str) -> AsyncIterator[Lease]:
        """Hold a chunk serving ``name`` for the body; its duration is the model's next profile sample."""
        if name not in self.models:
            raise errors.SpecError(f"no reward model {name!r} in {FIELD} (known: {sorted(self.models)})",
                                   field="reward_fn")  # fmt: skip
        requested = self.clock()
        placement, degree, queued_s = await self._acquire(name)
        rm, chunk = self.models[name], placement.chunk
        try:
            restore_s = 0.0
            if placement.restore:
                restore_s = await self.engines.restore(rm, degree, chunk)
                self._restores.labels(name).inc()
                self._restore_s.labels(name).observe(restore_s)
            client = self.engines.client(name, degree, chunk)
            lease = Lease(name, degree, chunk, client, queued_s, restore_s, self.engines.served_name(name))
        except BaseException:
            # Not resident after all (its restore failed, or its engine died): the next grant restores it.
            self.pool = buddy.forget(self.pool, variant(name, degree), chunk)
            self._give_back(chunk)
            raise
        started = self.clock()
        try:
            yield lease
        finally:
            execution_s = self.clock() - started
            self.profiles[name].observe(degree, execution_s)
            self.action_metrics.phases(
                GPU, queue_s=queued_s, execution_s=execution_s, total_s=self.clock() - requested
            )
            self._give_back(chunk)

    async def _acquire(self, name: str) -> tuple[buddy.Placement, int, float]:
        action = self.profiles[name].action(f"{name}-{next(self._ids)}")
        request = _Request(action, name, self.clock(), asyncio.get_running_loop().create_future())
        self._waiting.append(request)
        self._schedule()
        try:
            return await asyncio.shield(request.future)
        except asyncio.CancelledError:
            if request in self._waiting:
                self._waiting.remove(request)
            elif request.future.done() and not request.future.cancelled():
                self._give_back(request.future.result()[0].chunk)
            raise

    def _give_back(self, chunk: buddy.Chunk) -> None:
        self._running.pop(chunk, None)
        self.pool = buddy.release(self.pool, chunk)
        self._schedule()

    def _schedule(self) -> None:
        """One round of Alg. 1 over the queue; each grant is placed by the buddy allocator."""
        self._waiting = [r for r in self._waiting if not r.future.done()]
        if self._waiting and self.pool.free:
            now = self.clock()
            running = [
                model.Running(GPU, degree, max(0.0, expected - (now - started)))
                for degree, started, expected in self._running.values()
            ]
            status = {GPU: pools.ChunkPool(buddy.inventory(self.pool), self.total)}
            grants = schedule.decide([r.action for r in self._waiting], running, status, self.settings)
            units = {g.action_id: g.units[GPU] for g in grants}
            left = []
            for r in self._waiting:
                if (k := units.get(r.action.id)) is None:
                    left.append(r)
                    continue
                rm = self.models[r.name]
                before = self.pool.cached
                got = buddy.allocate(self.pool, k, variant(r.name, k), rm.weights_gb / k * FOOTPRINT)
                if got is None:  # Alg. 1 admitted it by buddy.fits: the allocator agrees, or it is a bug
                    raise RuntimeError(f"Alg. 1 granted {k} GPUs that the buddy pool cannot place")
                self.pool, placement = got
                self._evict(before, self.pool.cached)
                self._running[placement.chunk] = (k, now, r.action.duration(k))
                self.action_metrics.units.labels(GPU).inc(k)
                r.future.set_result((placement, k, now - r.since))
            self._waiting = left
        self.action_metrics.queued.labels(GPU).set(len(self._waiting))
        self._busy.set(self.total - self.free_gpus)

    def _evict(self, before: Sequence[buddy.Cached], after: Sequence[buddy.Cached]) -> None:
        kept = {(c.service, c.chunk) for c in after}
        for c in before:
            if (c.service, c.chunk) not in kept:
                name, _, degree = c.service.rpartition("@tp")
                self.engines.evict(name, int(degree), c.chunk)
                self._evictions.labels(name).inc()
