"""Weight sync driven by the job's own services (RollArt): every worker of an agent to a published version.

Called by placement's gRPC servicer (``SwapWeights`` / ``PrefetchWeights``), which a trainer calls
through the SDK (``treadle.client.swapper.ClusterSwapper``); the trainer suspends the scheduler
around the swap and commits the version after it (``treadle.trainer.loop``). Placement is the one
service that knows every registered worker, its agent and its addresses, so the fan-out runs here:

1. ``prefetch``: every worker of the agent starts pulling the version while it keeps generating
   (the weights extension, ``treadle.weights.vllm_extension``), so the pull is hidden;
2. ``swap``: ``PlacementService.begin_swap`` makes the version the agent's *target*, then every
   worker is swapped concurrently through ``agent.client.swap`` (one swap at a time per worker is the
   agent's rule): pause with ``mode=wait``, apply (every byte and shape validated before the model is
   touched; refused: the engine keeps its previous version whole), relabel, resume. A worker busy
   with another swap is tried again until the deadline; one whose agent is unreachable (its
   container restarting) is tried again for ``unreachable_after_s``, then reported ``unreachable``;
   one whose agent stopped reporting (``PlacementService.lost``: its pod was deleted) is not tried,
   or its try is cancelled as soon as placement sees it silent, and it is reported ``lost``; one the
   engine refused is reported ``failed`` at once (its engine is intact, so trying again at once
   would only pull the same bytes again); one that now serves another agent (a rebalancing move)
   is reported ``moved``. At the deadline the swaps still running are cancelled (the agent is
   resumed on whatever it holds) and reported ``timeout``.

Why not wait for an unreachable or lost worker until the deadline: the trainer holds the scheduler
suspended for the whole swap, so one deleted inference pod stalled training for the deadline (300 s
by default; a deleted pod's address may not even refuse a connection, so one try could take it
all). Nothing needs the wait: its agent, or the pod that replaces it, is told the target in the
answer to its load reports and loads it before placement gives it a turn beyond the staleness bound.

After the fan-out the target stays: a worker that did not swap, or whose engine restarts later, is
told it in every ``ReportLoadResponse`` and loads it itself (``agent.reporter``), and placement
assigns no turn to a worker more than the job's staleness bound behind it (``PlacementService.current``).

Failure handling, chosen: a refused version does not restart the engine. Nothing was loaded (the
extension validates before it loads), so the engine serves its previous version whole, and a
restart would cost a full engine start to pull the same bytes again; instead the worker stays out
of rotation once it falls beyond the staleness bound, and its agent pulls again. A load that fails
after the model was modified is different: the extension exits the engine (``weights.loader``),
its container restarts on the checkpoint, and the agent loads the target before placement gives it
a turn. The SIMULATED engine (``treadle.services.fakevllm``) loads nothing: without
``apply_weights`` only the label moves.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from typing import Any, Protocol

import prometheus_client as prom
from prometheus_client import core as prom_core
from prometheus_client import registry as prom_registry

from treadle import errors, metrics
from treadle.services.agent import client as agent_client
from treadle.services.placement import protocol, service
from treadle.v1 import placement_pb2

log = logging.getLogger(__name__)
RETRY_WAIT_S = 0.5
"""Between tries of a worker whose agent is unreachable or busy with another swap; also how often a
running try looks whether its worker was lost."""
UNREACHABLE_AFTER_S = 15.0
"""A worker whose agent refuses connections this long is reported ``unreachable``: longer than an
agent container's restart, and than placement's ``--lost-after-s``, so a deleted pod shows as ``lost``."""
SWAP_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900)


class WorkerSwapper(Protocol):
    async def swap(
        self, worker: placement_pb2.Worker, *, agent: str, version: int, expect_agent: str = ""
    ) -> agent_client.Swapped: ...

    async def prefetch(self, worker: placement_pb2.Worker, *, version: int) -> None: ...


class WeightSync:
    def __init__(
        self,
        svc: service.PlacementService,
        swapper: WorkerSwapper,
        *,
        apply_weights: bool,
        unreachable_after_s: float = UNREACHABLE_AFTER_S,
        watch_s: float = RETRY_WAIT_S,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.svc = svc
        self.swapper = swapper
        self.apply_weights = apply_weights
        """Swaps load weights (real vLLM); told to agents so their own reloads do the same."""
        self.unreachable_after_s = unreachable_after_s
        self.watch_s = watch_s
        """How often a running try looks whether placement lost its worker (real time)."""
        self.clock = clock
        self.sleep = sleep
        self._seconds = prom.Histogram(
            metrics.PLACEMENT_WEIGHT_SWAP_SECONDS,
            "Per worker, the exposed part of a weight swap (paused); pull: prefetched (hidden), pulled "
            "(during the pause), held (already loaded) or label (SIMULATED engine)",
            ["pool", "pull"], registry=svc.registry, buckets=SWAP_BUCKETS,
        )  # fmt: skip
        self._failures = prom.Counter(
            metrics.PLACEMENT_WEIGHT_SWAP_FAILURES_TOTAL,
            "Workers that did not swap to a version, by outcome (failed, timeout, unreachable, lost)",
            ["pool", "outcome"], registry=svc.registry,
        )  # fmt: skip
        svc.registry.register(_VersionCollector(svc))

    async def prefetch(self, req: protocol.SwapRequest) -> protocol.SwapResult:
        agent = protocol.check_swap(req, self.svc.agents())
        workers = self.svc.workers_of(agent)
        done = await asyncio.gather(*(self._prefetch_one(w, req.version) for w in workers))
        return protocol.SwapResult(version=req.version, agent=agent, workers=tuple(done))

    async def _prefetch_one(self, worker: placement_pb2.Worker, version: int) -> protocol.WorkerSwap:
        began = self.clock()
        return await self._unless_lost(worker, began, self._prefetch_try(worker, version, began))

    async def _prefetch_try(
        self, worker: placement_pb2.Worker, version: int, began: float
    ) -> protocol.WorkerSwap:
        try:
            await self.swapper.prefetch(worker, version=version)
        except errors.TreadleError as exc:  # not fatal: the swap pulls (and validates) by itself
            log.warning("prefetch of v%d on %s failed: %s", version, worker.worker_id, exc)
            return self._result(worker, "failed", began, error=str(exc))
        return self._result(worker, "started", began)

    async def swap(self, req: protocol.SwapRequest) -> protocol.SwapResult:
        agent, workers = self.svc.begin_swap(req)
        deadline = self.clock() + req.timeout_s
        done = await asyncio.gather(*(self._swap_one(w, agent, req, deadline) for w in workers))
        for r in done:
            if r.outcome == "swapped":
                self._seconds.labels(r.pool, r.pull).observe(r.exposed_seconds)
            elif r.outcome in ("failed", "timeout", "unreachable", "lost"):
                self._failures.labels(r.pool, r.outcome).inc()
                log.warning("v%d not applied on %s (%s): %s", req.version, r.worker_id, r.outcome, r.error)
        return protocol.SwapResult(version=req.version, agent=agent, workers=tuple(done))

    async def _swap_one(
        self, worker: placement_pb2.Worker, agent: str, req: protocol.SwapRequest, deadline: float
    ) -> protocol.WorkerSwap:
        began = self.clock()
        tried: list[str] = []
        try:
            try:
                async with asyncio.timeout(max(0.0, deadline - began)):
                    tries = self._tries(worker, agent, req.version, began, tried)
                    result = await self._unless_lost(worker, began, tries)
            except TimeoutError:
                last = tried[-1] if tried else "the first try"
                error = f"still swapping after {req.timeout_s:g}s; last: {last}"
                result = self._result(worker, "timeout", began, error=error)
        except BaseException:
            self.svc.end_swap(worker.worker_id, loaded=None)
            raise
        self.svc.end_swap(worker.worker_id, loaded=req.version if result.outcome == "swapped" else None)
        return result

    async def _tries(
        self, worker: placement_pb2.Worker, agent: str, version: int, began: float, tried: list[str]
    ) -> protocol.WorkerSwap:
        weights_agent = self.svc.weights_agent(agent)
        unreachable_since: float | None = None
        while True:
            tried_at = self.clock()
            try:
                done = await self.swapper.swap(
                    worker, agent=weights_agent, version=version, expect_agent=weights_agent
                )
            except agent_client.SwapContended as exc:
                if self.svc.serving(worker.worker_id) != agent:
                    return self._result(worker, "moved", began, error=str(exc))
                tried.append(str(exc))  # another swap holds it (a move, its agent's own reload)
                unreachable_since = None
            except agent_client.SwapRefused as exc:
                return self._result(worker, "failed", began, error=str(exc))
            except errors.Unavailable as exc:
                tried.append(str(exc))  # its agent or engine is unreachable (restarting)
                unreachable_since = tried_at if unreachable_since is None else unreachable_since
                if (away := self.clock() - unreachable_since) >= self.unreachable_after_s:
                    error = f"unreachable for {away:.0f}s; its agent loads it when back: {exc}"
                    return self._result(worker, "unreachable", began, error=error)
            else:
                return self._result(worker, "swapped", began, exposed_s=done.exposed_s, pull=done.pull)
            await self.sleep(RETRY_WAIT_S)

    async def _unless_lost(
        self, worker: placement_pb2.Worker, began: float, work: Coroutine[Any, Any, protocol.WorkerSwap]
    ) -> protocol.WorkerSwap:
        """``work``'s answer, or ``lost`` (``work`` cancelled, or never started) once placement sees the
        worker's agent silent: a deleted pod's address may never answer a try."""
        task = asyncio.ensure_future(work)
        try:
            while not self.svc.lost(worker.worker_id):
                done, _ = await asyncio.wait({task}, timeout=self.watch_s)
                if done:
                    return task.result()
        finally:
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        silent = self.svc.silent_s(worker.worker_id)
        error = f"no load report for {silent:.0f}s (pod gone or agent down); it loads the target when back"
        return self._result(worker, "lost", began, error=error)

    def _result(
        self, worker: placement_pb2.Worker, outcome: protocol.SwapOutcome, began: float, *,
        error: str = "", exposed_s: float = 0.0, pull: str = "",
    ) -> protocol.WorkerSwap:  # fmt: skip
        return protocol.WorkerSwap(
            worker_id=worker.worker_id, pool=worker.pool, outcome=outcome, error=error[:500],
            seconds=self.clock() - began, exposed_seconds=exposed_s, pull=pull,
        )  # fmt: skip


class _VersionCollector(prom_registry.Collector):
    """Per pool, at scrape time: the lowest and highest version its workers serve, and their target."""

    def __init__(self, svc: service.PlacementService) -> None:
        self.svc = svc

    def collect(self) -> Iterator[prom_core.Metric]:
        family = prom_core.GaugeMetricFamily(
            metrics.PLACEMENT_POOL_WEIGHT_VERSION,
            "Weight versions a pool's workers serve (stat min, max) and should serve (stat target)",
            labels=["pool", "stat"],
        )
        for pool, (low, high, target) in sorted(self.svc.pool_versions().items()):
            family.add_metric([pool, "min"], low)
            family.add_metric([pool, "max"], high)
            if target is not None:
                family.add_metric([pool, "target"], target)
        yield family
