"""``python -m treadle.services.placement``: run placement for a job's pools and tasks.

Flags override; a pod started by the operator takes pools, tasks and the policy from the job's
config and ``TREADLE_PLACEMENT_POLICY`` (``treadle.services.podenv``).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
from collections.abc import Mapping

import prometheus_client as prom

from treadle.policy import registry
from treadle.services import podenv
from treadle.services.grpcutil import server as grpcutil_server
from treadle.services.placement import grpc_server, service

PROG = "python -m treadle.services.placement"


@dataclasses.dataclass(frozen=True)
class Config:
    host: str
    port: int
    metrics_port: int
    pools: dict[str, str]
    tasks: dict[str, service.TaskPlacement]
    policy: str


def parse_args(argv: list[str] | None = None, environ: Mapping[str, str] = os.environ) -> Config:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=50052)
    p.add_argument("--metrics-port", type=int, default=0, help="Prometheus /metrics port (0: none)")
    p.add_argument("--pools", help='JSON object pool -> preferred work, e.g. {"decode": "decode-heavy"}')
    p.add_argument("--tasks", help='JSON object task -> {"affinity": "auto", "pools": []}, e.g. {"math": {}}')
    p.add_argument("--policy", help="placement policy (treadle.policy.registry)")
    a = p.parse_args(argv)
    job = podenv.Job(environ)

    def build() -> Config:
        tasks = (
            {name: service.TaskPlacement(**spec) for name, spec in json.loads(a.tasks).items()}
            if a.tasks
            else job.config.task_placement
        )
        # Without a job (a bare process in a test), the registry's default policy.
        policy = a.policy or (job.config.placement_policy if job.present else registry.DEFAULT_PLACEMENT)
        pools = json.loads(a.pools) if a.pools else job.config.pools
        return Config(host=a.host, port=a.port, metrics_port=a.metrics_port, pools=pools, tasks=tasks,
                      policy=policy)  # fmt: skip

    return podenv.or_exit(build, prog=PROG)


async def main(cfg: Config) -> None:
    svc = service.PlacementService(pools=cfg.pools, tasks=cfg.tasks, policy=cfg.policy)
    if cfg.metrics_port:
        prom.start_http_server(cfg.metrics_port, addr=cfg.host, registry=svc.registry)
    served = await grpc_server.build_server(svc, host=cfg.host, port=cfg.port)
    logging.info("placement serving on %s:%d", cfg.host, served.port)
    await grpcutil_server.serve_forever(served)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    asyncio.run(main(parse_args()))
