"""Routes of the inference agent; ``build_app`` is called by ``__main__``, tests and benchmarks."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import fastapi
import prometheus_client

from treadle.services.agent import protocol, reporter, service
from treadle.services.httputil import app as http_app
from treadle.services.httputil import errors as http_errors


def build_app(
    *,
    engine_url: str,
    worker_id: str,
    registry: prometheus_client.CollectorRegistry | None = None,
    poll_interval_s: float = 0.5,
    placement: str | None = None,
    pool: str = "",
    address: str = "",
) -> fastapi.FastAPI:
    """With ``placement`` the agent registers as ``worker_id`` of ``pool`` at ``address`` and reports
    its load every ``poll_interval_s``; without it the caller registers it (local mode)."""
    registry = registry or http_app.registry()
    svc = service.AgentService(engine_url=engine_url, worker_id=worker_id, registry=registry)
    report = (
        reporter.LoadReporter(
            svc=svc, placement=placement, pool=pool, address=address, interval_s=poll_interval_s
        )
        if placement
        else None
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: fastapi.FastAPI) -> AsyncIterator[None]:
        await svc.start()
        background = [asyncio.create_task(svc.poll_forever(poll_interval_s), name="engine poller")]
        if report is not None:
            background.append(asyncio.create_task(report.run_forever(), name="load reporter"))
        try:
            yield
        finally:
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            if report is not None:
                await report.aclose()
            await svc.aclose()

    app = http_app.new_app(
        title="treadle-agent", registry=registry, lifespan=lifespan, max_body_bytes=32 * 1024 * 1024
    )
    app.state.svc = svc
    app.state.reporter = report

    @app.post("/v1/generate", tags=["agent"], responses=http_errors.ERROR_RESPONSES)
    async def generate(req: protocol.GenerateRequest) -> protocol.GenerateResult:
        return await svc.generate(req)

    @app.post("/v1/abort", tags=["agent"], responses=http_errors.ERROR_RESPONSES)
    async def abort(req: protocol.AbortRequest) -> protocol.AbortResult:
        return protocol.AbortResult(trajectory_id=req.trajectory_id, aborted=svc.abort(req.trajectory_id))

    @app.get("/v1/load", tags=["agent"])
    async def load() -> protocol.WorkerLoad:
        return svc.load()

    @app.post("/v1/pause", tags=["agent"], responses=http_errors.ERROR_RESPONSES)
    async def pause(req: protocol.PauseRequest) -> dict[str, str]:
        await svc.pause(req.mode)
        return {"status": "paused"}

    @app.post("/v1/resume", tags=["agent"], responses=http_errors.ERROR_RESPONSES)
    async def resume() -> dict[str, str]:
        await svc.resume()
        return {"status": "resumed"}

    return app
