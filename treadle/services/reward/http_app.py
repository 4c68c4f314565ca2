"""Routes of the reward gateway; ``build_app`` is called by ``__main__`` and by tests."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import fastapi
import httpx
import prometheus_client

from treadle.api import v1alpha1
from treadle.sandbox import cores, runner
from treadle.services.httputil import app as http_app
from treadle.services.httputil import errors as http_errors
from treadle.services.reward import engines as engines_
from treadle.services.reward import functions, gpus, protocol, service


def build_app(
    *,
    registry: prometheus_client.CollectorRegistry | None = None,
    judge_url: str | None = None,
    judge_model: str | None = None,
    external_url: str | None = None,
    user_prefixes: tuple[str, ...] = (),
    max_concurrency: int = 64,
    timeout_s: float = 30.0,
    sandbox_concurrency: int = 4,
    cpus_per_action: int | None = None,
    reward_models: tuple[v1alpha1.RewardModel, ...] = (),
    reward_model_gpus: int = 0,
    gpu_memory_gb: float = 80.0,
    backup_dir: Path = engines_.BACKUP_DIR,
    token: str | None = None,
) -> fastapi.FastAPI:
    """``cpus_per_action``: the most cores the pod's action manager (``treadle.sandbox.cores``) grants
        one ``code-tests`` run (None: runs are not pinned). ``reward_models``: served on
        ``reward_model_gpus`` GPUs of ``gpu_memory_gb`` each by the GPU manager (``gpus``), with vLLM engines
    their checkpoints copied under ``backup_dir`` (host memory: a tmpfs). ``token``: the
        job's, required of every caller but the probes and Prometheus (``treadle.auth``)."""
    registry = registry or http_app.registry()
    action_metrics = cores.ActionMetrics(registry)
    manager = (
        None
        if cpus_per_action is None
        else cores.CoreManager(upper=cpus_per_action, action_metrics=action_metrics)
    )
    engines = engines_.engines(reward_models, backup_dir=backup_dir, gpu_gb=gpu_memory_gb)
    gpu_manager = None if engines is None else gpus.GpuManager(
        reward_models, gpus=reward_model_gpus, gpu_gb=gpu_memory_gb, engines=engines, registry=registry,
        action_metrics=action_metrics,
    )  # fmt: skip
    judge = httpx.AsyncClient(base_url=judge_url, timeout=timeout_s) if judge_url else None
    external = (
        functions.External(httpx.AsyncClient(timeout=timeout_s), external_url) if external_url else None
    )
    resources = functions.Resources(
        sandbox=runner.unavailable_or(lambda: runner.Sandbox(concurrency=sandbox_concurrency, cores=manager)),
        judge=judge, judge_model=judge_model, user_prefixes=user_prefixes, external=external,
        reward_models=gpu_manager,
    )  # fmt: skip
    svc = service.RewardService(
        registry=registry, resources=resources, max_concurrency=max_concurrency, timeout_s=timeout_s
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: fastapi.FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:
            for client in (judge, external.client if external else None):
                if client is not None:
                    await client.aclose()
            if engines is not None:
                await engines.aclose()

    app = http_app.new_app(title="treadle-reward", registry=registry, lifespan=lifespan, token=token)
    app.state.svc = svc

    @app.post("/v1/score", tags=["reward"], responses=http_errors.ERROR_RESPONSES)
    async def score(req: protocol.ScoreRequest) -> protocol.ScoreResult:
        return await svc.score(req)

    @app.get("/v1/functions", tags=["reward"])
    async def list_functions() -> list[protocol.RewardFnInfo]:
        if external is not None:
            forwarded = f"every name is forwarded to {external_url}"
            return [protocol.RewardFnInfo(name=protocol.ANY_FUNCTION, description=forwarded)]
        judges = [
            protocol.RewardFnInfo(
                name=f"{v1alpha1.JUDGE}{m.name}", description=f"reward model {m.model} on the gateway's GPUs"
            )
            for m in reward_models
        ]
        return [
            protocol.RewardFnInfo(name=n, description=d) for n, (_, d) in functions.BUILTIN.items()
        ] + judges

    return app
