"""``python -m treadle.services.feeder``: feed each dataset task's rows to the scheduler.

Reads the job as the other services do (``treadle.services.podenv``): its dataset tasks, target and
Hugging Face cache from the job file (``TREADLE_CONFIG``, ``treadle.api.jobconfig.FeederConfig``),
``TREADLE_JOB``, and ``TREADLE_REDIS_URL`` / ``TREADLE_SCHEDULER_ADDR`` / ``TREADLE_KEY_PREFIX``; the
flags override. A dataset that cannot be read is named by its field (``spec.tasks[i].dataset...``):
in a pod of a job (``TREADLE_NAMESPACE`` and credentials) the feeder stays up, not ready, writes the
reason on its job (``problem``, which the operator reports as Degraded) and reads the job file and
the datasets again every ``--retry-s``; elsewhere it exits 2 with that one line. Once every epoch
is fed it keeps serving its health, metrics and ``/v1/feeds`` (a finished feeder is not a crashed one).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import logging
import os
from collections.abc import Mapping
from pathlib import PurePosixPath

import redis.asyncio as aioredis
import uvicorn

from treadle import errors
from treadle.api import dataset as dataset_api
from treadle.api import env_vars, jobconfig
from treadle.services import podenv
from treadle.services.feeder import http_app, problem, service
from treadle.services.httputil import app as httputil_app
from treadle.services.httputil import serve
from treadle.services.scheduler import client as scheduler_client

PROG = "python -m treadle.services.feeder"
log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Config:
    host: str
    port: int
    feeder: jobconfig.FeederConfig
    redis_url: str
    scheduler: str
    namespace: str
    interval_s: float
    mount: PurePosixPath
    retry_s: float
    token: str | None
    metrics_port: int = 0


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
    p.add_argument("--hf-cache", help="Hugging Face hub cache (default: the job's, else HF_HUB_CACHE)")
    p.add_argument(
        "--retry-s", type=float, default=30.0, help="seconds between readings of an unusable dataset"
    )
    a = p.parse_args(argv)

    def build() -> Config:
        job = podenv.Job(environ).config
        feeder = job.feeder
        if a.target_pending is not None:
            feeder = dataclasses.replace(feeder, target_pending=a.target_pending)
        if a.hf_cache:
            feeder = dataclasses.replace(feeder, hf_cache=a.hf_cache)
        redis_url = podenv.pick(a.redis, environ, env_vars.REDIS_URL, flag="--redis")
        return Config(
            host=a.host, port=a.port, feeder=feeder, redis_url=podenv.redis_url(environ, redis_url),
            scheduler=podenv.pick(a.scheduler, environ, env_vars.SCHEDULER_ADDR, flag="--scheduler"),
            namespace=a.namespace or environ.get(env_vars.KEY_PREFIX) or job.job,
            interval_s=a.interval_s, mount=PurePosixPath(a.config_map_mount), retry_s=a.retry_s,
            metrics_port=podenv.metrics_port(environ),
            token=podenv.token(environ),
        )  # fmt: skip

    return podenv.or_exit(build, prog=PROG)


async def run(cfg: Config, datasets: list[service.TaskRows]) -> None:
    """Feed until every epoch is fed, serving until SIGTERM; a fatal feeding error stops both."""
    client = aioredis.Redis.from_url(cfg.redis_url)
    scheduler = scheduler_client.SchedulerClient(cfg.scheduler, token=cfg.token)
    registry = httputil_app.registry()
    svc = service.FeederService(
        feeds=service.feeds(datasets, client=client, namespace=cfg.namespace),
        scheduler=scheduler, target_pending=cfg.feeder.target_pending, registry=registry,
    )  # fmt: skip
    podenv.serve_metrics(registry, cfg.host, cfg.metrics_port)
    app = http_app.build_app(svc, registry, token=cfg.token)
    server = uvicorn.Server(serve.config(app, cfg.host, cfg.port))
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


async def wait_for_datasets(
    argv: list[str] | None, environ: Mapping[str, str], reporter: problem.ProblemReporter
) -> tuple[Config, list[service.TaskRows]] | None:
    """The config and every dataset's rows, once they can be read; None if SIGTERM came first.

    Meanwhile the feeder is alive (its port answers) but not ready (``/healthz`` fails), and its job
    carries the reason, so a bad dataset shows as the job's Degraded condition, not a crash loop.
    """
    cfg = parse_args(argv, environ)
    try:
        datasets = service.read_datasets(cfg.feeder, mount=cfg.mount)
    except errors.SpecError as exc:
        why = str(exc)
    else:
        await reporter.report(None)  # what an earlier pod of the job said is over
        return cfg, datasets
    app = httputil_app.new_app(title="treadle feeder", registry=httputil_app.registry(), ready=lambda: False)
    server = uvicorn.Server(serve.config(app, cfg.host, cfg.port))
    serving = asyncio.create_task(server.serve(), name="serving")
    try:
        while True:
            log.error("cannot feed (reading again in %.0fs): %s", cfg.retry_s, why)
            await reporter.report(why)
            done, _ = await asyncio.wait({serving}, timeout=cfg.retry_s)
            if done:
                return None
            cfg = parse_args(argv, environ)  # the job file too: a fixed spec reaches the mounted copy
            try:
                datasets = service.read_datasets(cfg.feeder, mount=cfg.mount)
            except errors.SpecError as exc:
                why = str(exc)
                continue
            log.info("every dataset is readable now")
            await reporter.report(None)
            return cfg, datasets
    finally:
        server.should_exit = True
        await serving


async def run_in_pod(
    argv: list[str] | None, environ: Mapping[str, str], reporter: problem.ProblemReporter
) -> None:
    try:
        ready = await wait_for_datasets(argv, environ, reporter)
    finally:
        await reporter.aclose()
    if ready is not None:
        await run(*ready)


def main(argv: list[str] | None = None, environ: Mapping[str, str] = os.environ) -> None:
    reporter = problem.ProblemReporter.from_env(environ)
    if reporter is not None:
        asyncio.run(run_in_pod(argv, environ, reporter))
        return
    cfg = parse_args(argv, environ)
    datasets = podenv.or_exit(lambda: service.read_datasets(cfg.feeder, mount=cfg.mount), prog=PROG)
    asyncio.run(run(cfg, datasets))


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    main()
