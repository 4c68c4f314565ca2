"""Routes of the env service; ``build_app`` is called by ``__main__`` and by tests."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping

import fastapi
import prometheus_client
import redis.asyncio as aioredis

from treadle import errors, metrics
from treadle.api import env_vars
from treadle.policy.tangram import quota
from treadle.sandbox import cores, runner
from treadle.services.env import base, protocol, pythoncode, quotas, service
from treadle.services.httputil import app as http_app
from treadle.services.httputil import errors as http_errors


def build_app(
    *,
    registry: prometheus_client.CollectorRegistry | None = None,
    max_sessions: int = 10_000,
    step_timeout_s: float = 30.0,
    idle_ttl_s: float = 900.0,
    sandbox_concurrency: int = 4,
    warm_pool: int = 0,
    cpus_per_action: int | None = None,
    user_prefixes: tuple[str, ...] = (),
    api_quotas: Mapping[str, quota.Limit] | None = None,
    redis_url: str = "",
    namespace: str = "default",
    svc: service.EnvService | None = None,
    token: str | None = None,
) -> fastapi.FastAPI:
    """``warm_pool``: started sandbox processes kept ready for python-code's runs (``runner.Sandbox``
    ``warm``); math-tool and frozenlake open in some 20 us from the seed alone, so nothing of theirs
    is pre-started. ``cpus_per_action``: the most cores the pod's action manager
    (``treadle.sandbox.cores``) grants one sandboxed run. ``user_prefixes``:
    module prefixes user environments (``py:<module>:<Class>``) may come from. ``api_quotas``: the
    job's quotas by tool, kept in Redis at ``redis_url`` under ``namespace`` (``quotas``), shared
    with every env server of the job."""
    registry = registry or http_app.registry()
    actions = cores.ActionMetrics(registry)
    limits = dict(api_quotas or {})
    if limits and not redis_url:
        raise errors.SpecError(
            f"the job has API quotas ({sorted(limits)}), kept in Redis for all env pods: set the address",
            field=env_vars.REDIS_URL,
        )
    redis = aioredis.Redis.from_url(redis_url, protocol=2) if limits else None
    shared = (
        None if redis is None else quotas.Quotas(
            client=redis, namespace=namespace, limits=limits, registry=registry, action_metrics=actions
        )
    )  # fmt: skip
    manager = (
        None if cpus_per_action is None else cores.CoreManager(upper=cpus_per_action, action_metrics=actions)
    )
    svc = svc or service.EnvService(
        registry=registry,
        context=base.Context(
            sandbox=runner.unavailable_or(
                lambda: runner.Sandbox(concurrency=sandbox_concurrency, cores=manager, warm=warm_pool)
            )
        ),
        max_sessions=max_sessions, step_timeout_s=step_timeout_s, idle_ttl_s=idle_ttl_s,
        user_prefixes=user_prefixes, quotas=shared,
    )  # fmt: skip
    box = svc.context.sandbox
    if isinstance(box, runner.Sandbox):
        ready = prometheus_client.Gauge(
            metrics.ENV_WARM_READY, "Started sandbox processes ready for a run", ["env"], registry=registry
        )
        ready.labels(pythoncode.SPEC.name).set_function(lambda: box.warm_ready)

    @contextlib.asynccontextmanager
    async def lifespan(app: fastapi.FastAPI) -> AsyncIterator[None]:
        reaper = asyncio.create_task(_reap_forever(svc))
        if isinstance(box, runner.Sandbox):
            box.start_warm()
        try:
            yield
        finally:
            reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reaper
            await svc.close_all()
            if isinstance(box, runner.Sandbox):
                await box.close()
            if redis is not None:
                await redis.aclose()

    # token: the job's, required of every caller but the probes and Prometheus (treadle.auth).
    app = http_app.new_app(title="treadle-env", registry=registry, lifespan=lifespan, token=token)
    app.state.svc = svc

    @app.get("/v1/envs", tags=["env"])
    async def list_envs() -> list[protocol.EnvInfo]:
        return [protocol.EnvInfo(name=s.name, description=s.description) for s in svc.specs.values()]

    @app.post("/v1/sessions", tags=["env"], responses=http_errors.ERROR_RESPONSES)
    async def open_session(req: protocol.OpenRequest) -> protocol.Observation:
        return await svc.open(req)

    @app.post("/v1/sessions/{session_id}/step", tags=["env"], responses=http_errors.ERROR_RESPONSES)
    async def step_session(session_id: str, req: protocol.StepRequest) -> protocol.StepResult:
        return await svc.step(session_id, req.action, index=req.step)

    @app.delete("/v1/sessions/{session_id}", tags=["env"], responses=http_errors.ERROR_RESPONSES)
    async def close_session(session_id: str) -> dict[str, bool]:
        await svc.close(session_id)
        return {"closed": True}

    @app.get("/v1/stats", tags=["env"])
    async def stats() -> protocol.SessionStats:
        return svc.stats()

    return app


async def _reap_forever(svc: service.EnvService) -> None:
    while True:
        await asyncio.sleep(max(svc.idle_ttl_s / 4, 1.0))
        await svc.reap()
