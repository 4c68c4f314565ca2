"""``python -m treadle.services.buffer``: run the buffer (embedded memory store, or Redis).

A pod started by the operator (and local mode, the same way) takes the staleness bound, task weights
and agents from the job file, the store from ``TREADLE_REDIS_URL`` and ``TREADLE_KEY_PREFIX``
(``treadle.services.podenv``; ``--redis`` and ``--namespace`` override them); a process started by
hand writes a job file too (``podenv.job_env``).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
from collections.abc import Mapping

from treadle.api import env_vars
from treadle.services import podenv, runtime
from treadle.services.buffer import grpc_server, redis_store, service, store
from treadle.services.grpcutil import server as grpcutil_server

PROG = "python -m treadle.services.buffer"


@dataclasses.dataclass(frozen=True)
class Config:
    host: str
    port: int
    metrics_port: int
    redis: str
    namespace: str
    alpha: int
    task_weights: dict[str, float]
    agents: list[str]
    lease_s: float
    token: str | None


def parse_args(argv: list[str] | None = None, environ: Mapping[str, str] = os.environ) -> Config:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=50053)
    p.add_argument(
        "--metrics-port", type=int, help=f"Prometheus /metrics port (${env_vars.METRICS_PORT}; 0: none)"
    )
    p.add_argument("--redis", help=f"Redis URL, empty for the embedded memory store (${env_vars.REDIS_URL})")
    p.add_argument("--namespace", help=f"key namespace in Redis, one per job (${env_vars.KEY_PREFIX})")
    p.add_argument("--lease-s", type=float, default=300.0, help="default lease before redelivery")
    a = p.parse_args(argv)
    job = podenv.Job(environ)

    def build() -> Config:
        return Config(
            host=a.host, port=a.port, metrics_port=podenv.metrics_port(environ, a.metrics_port),
            redis=podenv.redis_url(environ, a.redis),
            namespace=a.namespace or environ.get(env_vars.KEY_PREFIX) or "default",
            alpha=job.config.buffer.alpha, task_weights=job.config.buffer.task_weights,
            agents=job.config.buffer.agents,
            lease_s=a.lease_s, token=podenv.token(environ),
        )  # fmt: skip

    return podenv.or_exit(build, prog=PROG)


async def main(cfg: Config) -> None:
    backend: store.Store = (
        redis_store.RedisStore.from_url(cfg.redis, namespace=cfg.namespace)
        if cfg.redis
        else store.MemoryStore()
    )
    svc = service.BufferService(
        store=backend, alpha=cfg.alpha, task_weights=cfg.task_weights, agents=cfg.agents,
        default_lease_s=cfg.lease_s,
    )  # fmt: skip
    podenv.serve_metrics(svc.registry, cfg.host, cfg.metrics_port)
    served = await grpc_server.build_server(svc, host=cfg.host, port=cfg.port, token=cfg.token)
    runtime.settle_heap()
    logging.info("buffer serving on %s:%d (%s)", cfg.host, served.port, "redis" if cfg.redis else "memory")
    await grpcutil_server.serve_forever(served, on_stop=backend.aclose)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    asyncio.run(main(parse_args()))
