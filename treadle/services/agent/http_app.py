"""Routes of the inference agent; ``build_app`` is called by ``__main__``, tests and benchmarks."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import fastapi
import fastapi.exceptions
import fastapi.routing
import prometheus_client
import pydantic
import starlette.routing

from treadle.services.agent import protocol, reload, reporter, served, service
from treadle.services.httputil import app as http_app
from treadle.services.httputil import errors as http_errors

log = logging.getLogger(__name__)


def _json_body(model: type[pydantic.BaseModel]) -> dict[str, Any]:
    """OpenAPI request body of a route that parses ``model`` itself (nested models inlined)."""
    schema = model.model_json_schema()
    defs = schema.pop("$defs", {})

    def inline(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref", "")
            if ref.startswith("#/$defs/"):
                return inline(defs[ref.removeprefix("#/$defs/")])
            return {key: inline(value) for key, value in node.items()}
        return [inline(item) for item in node] if isinstance(node, list) else node

    return {"requestBody": {"required": True, "content": {"application/json": {"schema": inline(schema)}}}}


def build_app(
    *,
    engine_url: str,
    worker_id: str,
    registry: prometheus_client.CollectorRegistry | None = None,
    poll_interval_s: float = 0.5,
    placement: str | None = None,
    pool: str = "",
    address: str = "",
    agent: str = "",
    swap_lease_s: float = service.DEFAULT_SWAP_LEASE_S,
    state_file: Path | None = None,
    token: str | None = None,
) -> fastapi.FastAPI:
    """With ``placement`` the agent registers as ``worker_id`` of ``pool`` at ``address`` and reports
    its load every ``poll_interval_s``; without it the caller registers it (local mode). ``agent``:
    whose weights the engine starts with (swaps expecting another are refused). A swap's pause not
    resumed within ``swap_lease_s`` is resumed by the agent. ``state_file``: where the agent and pool
    the worker serves after a move are kept across restarts of this container (``served``). ``token``:
    the job's, required of every caller but the probes and Prometheus, and sent to placement."""
    registry = registry or http_app.registry()
    svc = service.AgentService(
        engine_url=engine_url, worker_id=worker_id, registry=registry, agent=agent, swap_lease_s=swap_lease_s
    )
    reloader: reload.Reloader | None = None
    report: reporter.LoadReporter | None = None
    if placement:
        # Loads the version placement says the worker should serve; records it like any resume does.
        reloader = reload.Reloader(svc, registry=registry, on_resumed=lambda: record())
        report = reporter.LoadReporter(
            svc=svc, placement=placement, pool=pool, address=address, interval_s=poll_interval_s,
            reloader=reloader, token=token,
        )  # fmt: skip

    @contextlib.asynccontextmanager
    async def lifespan(app: fastapi.FastAPI) -> AsyncIterator[None]:
        await svc.start()
        background = [asyncio.create_task(svc.poll_forever(poll_interval_s), name="engine poller")]
        if state_file is not None or report is not None:
            background.append(asyncio.create_task(restore_then_report(), name="load reporter"))
        try:
            yield
        finally:
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            if reloader is not None:
                await reloader.aclose()
            if report is not None:
                await report.aclose()
            await svc.aclose()

    async def restore_then_report() -> None:
        # Register only once it is known whose weights the engine serves: a record of a move is
        # checked against the engine's label, which a busy or restarting engine may not give at once.
        if state_file is not None:
            await svc.answered.wait()
            restore(state_file)
        if report is not None:
            await report.run_forever()

    def restore(path: Path) -> None:
        saved = served.read(path)
        if saved is None:
            return
        if saved.label != svc.label:
            log.info("%s: engine shows %r, not %r as when %s was written: serving %r as rendered",
                     worker_id, svc.label, saved.label, path, svc.agent)  # fmt: skip
            return
        log.info("%s: still serving agent %r of pool %r (from %s)", worker_id, saved.agent, saved.pool, path)
        svc.agent = saved.agent
        if report is not None:
            report.rehome(saved.pool)

    app = http_app.new_app(
        title="treadle-agent",
        registry=registry,
        lifespan=lifespan,
        max_body_bytes=32 * 1024 * 1024,
        token=token,
    )
    app.state.svc = svc
    app.state.reporter = report

    @app.post(
        "/v1/generate", tags=["agent"], responses=http_errors.ERROR_RESPONSES,
        response_model=protocol.GenerateResult, openapi_extra=_json_body(protocol.GenerateRequest),
    )  # fmt: skip
    async def generate(request: fastapi.Request) -> fastapi.Response:
        # Parsed and validated by pydantic-core straight from the bytes, and answered the same way:
        # FastAPI's dependency solving around a model parameter cost a third of this route's CPU
        # (98 -> 64 us per request side by side), paid on every turn.
        try:
            req = protocol.GenerateRequest.model_validate_json(await request.body())
        except pydantic.ValidationError as exc:
            raise fastapi.exceptions.RequestValidationError(exc.errors(include_url=False)) from None
        result = await svc.generate(req)
        return fastapi.Response(result.model_dump_json(), media_type="application/json")

    # Served as a plain Starlette endpoint; the APIRoute above stays for the OpenAPI schema. FastAPI's
    # handler around an endpoint (dependency solving, exit stacks) was 14 of the app's 37 us per request
    # (ASGI calls in-process, stub service); errors still reach the app's handlers the same way.
    for route in app.router.routes:
        if isinstance(route, fastapi.routing.APIRoute) and route.path == "/v1/generate":
            route.app = starlette.routing.request_response(generate)

    @app.post("/v1/abort", tags=["agent"], responses=http_errors.ERROR_RESPONSES)
    async def abort(req: protocol.AbortRequest) -> protocol.AbortResult:
        return protocol.AbortResult(trajectory_id=req.trajectory_id, aborted=svc.abort(req.trajectory_id))

    @app.get("/v1/load", tags=["agent"])
    async def load() -> protocol.WorkerLoad:
        return svc.load()

    @app.post("/v1/pause", tags=["agent"], responses=http_errors.ERROR_RESPONSES)
    async def pause(req: protocol.PauseRequest) -> dict[str, str]:
        swap_id = await svc.pause(req.mode, expect_agent=req.expect_agent)
        return {"status": "paused", "swap_id": swap_id}

    @app.post("/v1/resume", tags=["agent"], responses=http_errors.ERROR_RESPONSES)
    async def resume(req: protocol.ResumeRequest | None = None) -> dict[str, str]:
        req = req or protocol.ResumeRequest()
        await svc.resume(agent=req.agent, swap_id=req.swap_id)
        if req.pool and report is not None:
            report.rehome(req.pool)
        record()
        return {"status": "resumed"}

    def record() -> None:
        """After every resume: what the worker serves now, for a restart of this container."""
        if state_file is None or report is None:
            return
        now = served.Served(agent=svc.agent, pool=report.worker.pool, label=svc.label or "")
        try:
            served.write(state_file, now)
        except OSError as exc:  # the swap succeeded; only a restart of this container forgets it
            log.error("%s: cannot record what it serves in %s: %s", worker_id, state_file, exc)

    return app
