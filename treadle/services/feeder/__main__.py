"""``python -m treadle.services.feeder``: feed each dataset task's rows to the scheduler.

Reads the job as the other services do (``treadle.services.podenv``): the spec from
``TREADLE_CONFIG``, ``TREADLE_JOB``, and ``TREADLE_REDIS_URL`` / ``TREADLE_SCHEDULER_ADDR`` /
``TREADLE_KEY_PREFIX``, which the flags override. A dataset that cannot be read exits 2 with one line
naming its field (``spec.tasks[i].dataset...``). Once every epoch is fed it keeps serving its
health, metrics and ``/v1/feeds`` (a finished feeder is not a crashed one).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import logging
import os
from collections.abc import Mapping
from pathlib import Path, PurePosixPath

import redis.asyncio as aioredis
import uvicorn

from treadle.api import dataset as dataset_api
from treadle.api import env_vars, v1alpha1
from treadle.services import podenv
from treadle.services.feeder import http_app, service
from treadle.services.httputil import app as httputil_app
from treadle.services.httputil import serve
from treadle.services.scheduler import client as scheduler_client

PROG = "python -m treadle.services.feeder"


@dataclasses.dataclass(frozen=True)
class Config:
    host: str
    port: int
    job: v1alpha1.RolloutJob
    redis_url: str
    scheduler: str
    namespace: str
    target_pending: int
    interval_s: float
    mount: PurePosixPath
    hf_cache: Path | None


def parse_args(argv: list[str] | None = None, environ: Mapping[str, str] = os.environ) -> Config:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8400)
    p.add_argument("--redis", help=f"Redis URL of the durable positions (${env_vars.REDIS_URL})")
    p.add_argument("--scheduler", help=f"scheduler gRPC address host:port (${env_vars.SCHEDULER_ADDR})")
    p.add_argument("--namespace", help=f"key namespace in Redis, one per job (${env_vars.KEY_PREFIX})")
    p.add_argument(
        "--target-pending", type=int, help="trajectories kept waiting for admission (default: batchSize)"
    )
    p.add_argument("--interval-s", type=float, default=0.5, help="seconds between feeding rounds")
    p.add_argument(
        "--config-map-mount", default=str(dataset_api.CONFIG_MAP_MOUNT), help="where ConfigMaps are"
    )
    p.add_argument("--hf-cache", type=Path, help="Hugging Face hub cache (default: HF_HUB_CACHE)")
    a = p.parse_args(argv)

    def build() -> Config:
        job = podenv.load_job(environ)
        return Config(
            host=a.host, port=a.port, job=job,
            redis_url=podenv.pick(a.redis, environ, env_vars.REDIS_URL, flag="--redis"),
            scheduler=podenv.pick(a.scheduler, environ, env_vars.SCHEDULER_ADDR, flag="--scheduler"),
            namespace=a.namespace or environ.get(env_vars.KEY_PREFIX) or job.name,
            target_pending=job.spec.rollout.batch_size if a.target_pending is None else a.target_pending,
            interval_s=a.interval_s, mount=PurePosixPath(a.config_map_mount), hf_cache=a.hf_cache,
        )  # fmt: skip

    return podenv.or_exit(build, prog=PROG)


async def run(cfg: Config, datasets: list[service.TaskRows]) -> None:
    """Feed until every epoch is fed, serving until SIGTERM; a fatal feeding error stops both."""
    client = aioredis.Redis.from_url(cfg.redis_url)
    scheduler = scheduler_client.SchedulerClient(cfg.scheduler)
    registry = httputil_app.registry()
    svc = service.FeederService(
        feeds=service.feeds(cfg.job.spec, datasets, client=client, namespace=cfg.namespace),
        scheduler=scheduler, target_pending=cfg.target_pending, registry=registry,
    )  # fmt: skip
    server = uvicorn.Server(serve.config(http_app.build_app(svc, registry), cfg.host, cfg.port))
    stop = asyncio.Event()
    feeding = asyncio.create_task(svc.run(interval_s=cfg.interval_s, stop=stop), name="feeding")
    serving = asyncio.create_task(server.serve(), name="serving")
    try:
        await asyncio.wait({feeding, serving}, return_when=asyncio.FIRST_COMPLETED)
        if feeding.done() and feeding.exception() is not None:
            server.should_exit = True
        await serving  # SIGTERM ends it (uvicorn's handlers), or the fatal error above
        stop.set()
        await feeding  # re-raises a fatal feeding error: the process exits 1 with it
    finally:
        feeding.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await feeding
        await scheduler.aclose()
        await client.aclose()


def main(argv: list[str] | None = None, environ: Mapping[str, str] = os.environ) -> None:
    cfg = parse_args(argv, environ)
    spec = cfg.job.spec
    datasets = podenv.or_exit(
        lambda: service.read_datasets(spec, mount=cfg.mount, hf_cache=cfg.hf_cache), prog=PROG
    )
    asyncio.run(run(cfg, datasets))


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    main()
