"""Routes of the inference agent; ``build_app`` is called by ``__main__``, tests and benchmarks."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import fastapi
import prometheus_client

from treadle.services.agent import protocol, service
from treadle.services.httputil import app as http_app
from treadle.services.httputil import errors as http_errors


def build_app(
    *,
    engine_url: str,
    worker_id: str,
    registry: prometheus_client.CollectorRegistry | None = None,
    poll_interval_s: float = 0.5,
) -> fastapi.FastAPI:
    registry = registry or http_app.registry()
    svc = service.AgentService(engine_url=engine_url, worker_id=worker_id, registry=registry)

    @contextlib.asynccontextmanager
    async def lifespan(app: fastapi.FastAPI) -> AsyncIterator[None]:
        await svc.start()
        poller = asyncio.create_task(svc.poll_forever(poll_interval_s))
        try:
            yield
        finally:
            poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await poller
            await svc.aclose()

    app = http_app.new_app(
        title="treadle-agent", registry=registry, lifespan=lifespan, max_body_bytes=32 * 1024 * 1024
    )
    app.state.svc = svc

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
