"""The agent's registration with placement and its load reports (the agent's side of placement).

Run by ``http_app``'s lifespan when the agent is told placement's address and its pool
(``--placement``/``TREADLE_PLACEMENT_ADDR``, ``--pool``/``TREADLE_POOL``, as the operator renders
them). Each interval it sends ``svc.load()`` (refreshed from the engine by the agent's poller); it
registers first, and again whenever placement answers ``NotFound`` (placement restarted and forgot
its workers). Failures are logged and retried at the next interval: placement being down must
never stop generation.

The pool it registers with starts as the pod's (``TREADLE_POOL``) and follows rebalancing: a move's
swap ends with a resume naming the receiver's pool (``rehome``), so a placement that restarts and
forgets its moves gets the worker back in the pool whose agent its engine serves, not in the pool its
pod was rendered for. A restart of the agent's container keeps it too (``served``: the pod's state file).

Placement answers each report with the version this worker should serve (weight sync); the
``reload.Reloader`` loads it when the engine serves another.
"""

from __future__ import annotations

import asyncio
import logging

from treadle import errors
from treadle.services import podenv
from treadle.services.agent import reload, service
from treadle.services.placement import client as placement_client
from treadle.v1 import placement_pb2

log = logging.getLogger(__name__)


class LoadReporter:
    def __init__(
        self,
        *,
        svc: service.AgentService,
        placement: str,
        pool: str,
        address: str,
        interval_s: float,
        reloader: reload.Reloader | None = None,
        token: str | None = None,
    ) -> None:
        """``reloader``: told placement's answer to every report (the version this worker should serve)."""
        self.svc = svc
        self.reloader = reloader
        # The engine's address lets placement move this worker to another agent (rebalancing).
        engine = podenv.peer_url(svc.engine.base_url, beside=address)
        self.worker = placement_pb2.Worker(
            worker_id=svc.worker_id, pool=pool, address=address, engine_address=engine
        )
        self.interval_s = interval_s
        self.placement = placement
        self.token = token
        # A grpc.aio channel belongs to the loop it was made in: made on first use, inside the server's.
        self._client: placement_client.PlacementClient | None = None
        self.registered = False
        self.reports = 0

    def rehome(self, pool: str) -> None:
        """Register in ``pool`` from now on (placement itself re-homed the worker when it moved it)."""
        if pool != self.worker.pool:
            log.info("%s now serves pool %s (was %s)", self.worker.worker_id, pool, self.worker.pool)
            self.worker.pool = pool

    async def report_once(self) -> None:
        """Register if needed, then send the current load; raises what placement answered."""
        if self._client is None:
            self._client = placement_client.PlacementClient(self.placement, token=self.token)
        if not self.registered:
            await self._client.register_worker(self.worker)
            self.registered = True
            log.info(
                "registered %s (pool %s) at %s", self.worker.worker_id, self.worker.pool, self.worker.address
            )
        load = self.svc.load()
        try:
            answer = await self._client.report_load(
                placement_pb2.WorkerLoad(
                    worker_id=load.worker_id, running=load.running, waiting=load.waiting,
                    kv_cache_usage=load.kv_cache_usage, policy_version=load.policy_version,
                    healthy=load.healthy,
                )
            )  # fmt: skip
        except errors.NotFound:
            self.registered = False
            raise
        self.reports += 1
        if self.reloader is not None:
            target = answer.weight_version if answer.HasField("weight_version") else None
            self.reloader.want(target, weights_agent=answer.weights_agent, apply=answer.apply_weights)

    async def run_forever(self) -> None:
        while True:
            try:
                await self.report_once()
            except errors.SpecError as exc:
                # Permanent for this config (unknown pool): say so loudly, retry in case placement changes.
                log.error("placement refused %s: %s", self.worker.worker_id, exc)
            except (errors.TreadleError, TimeoutError) as exc:
                log.info("load report to placement failed (retrying): %s", exc)
            await asyncio.sleep(self.interval_s)

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
