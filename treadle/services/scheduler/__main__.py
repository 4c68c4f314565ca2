"""``python -m treadle.services.scheduler``: run the scheduler against env, reward, placement and buffer.

Flags override; a pod started by the operator takes its tasks and settings from the job's config and
the addresses from ``TREADLE_*`` (``treadle.services.podenv``). Agents are reached at the addresses
placement hands out. In a cluster (``demand.RewardDemandReporter.from_env``) the scheduler also
reports every ``DEMAND_INTERVAL_S`` how many trajectories wait for or are in reward scoring, which
the operator turns into reward gateway replicas.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
import socket
import urllib.parse
from collections.abc import Mapping

import prometheus_client as prom

from treadle.services import podenv, runtime
from treadle.services.agent import client as agent_client
from treadle.services.buffer import client as buffer_client
from treadle.services.env import client as env_client
from treadle.services.grpcutil import server as grpcutil_server
from treadle.services.placement import client as placement_client
from treadle.services.reward import client as reward_client
from treadle.services.scheduler import demand, grpc_server, protocol, service

PROG = "python -m treadle.services.scheduler"
DEMAND_INTERVAL_S = 2.0
log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Config:
    host: str
    port: int
    metrics_port: int
    tasks: list[protocol.TaskConfig]
    settings: protocol.Settings
    env_urls: list[str]
    reward_url: str
    placement: str
    buffer: str


def parse_args(argv: list[str] | None = None, environ: Mapping[str, str] = os.environ) -> Config:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=50051)
    p.add_argument("--metrics-port", type=int, default=0, help="Prometheus /metrics port (0: none)")
    p.add_argument("--tasks", help="JSON list of TaskConfig fields, one object per task (the job's)")
    p.add_argument("--settings", help="JSON object of Settings fields (the job's)")
    p.add_argument(
        "--env-url", action="append", help=f"environment server base URL, repeatable (${podenv.ENV_URL})"
    )
    p.add_argument("--reward-url", help=f"reward gateway base URL (${podenv.REWARD_URL})")
    p.add_argument("--placement", help=f"placement gRPC address host:port (${podenv.PLACEMENT_ADDR})")
    p.add_argument("--buffer", help=f"buffer gRPC address host:port (${podenv.BUFFER_ADDR})")
    a = p.parse_args(argv)
    job = podenv.Job(environ)

    def build() -> Config:
        tasks = [protocol.TaskConfig(**t) for t in json.loads(a.tasks)] if a.tasks else job.config.tasks
        settings = (
            protocol.Settings(**json.loads(a.settings)) if a.settings is not None else job.config.settings
        )
        env_urls = a.env_url or [podenv.pick(None, environ, podenv.ENV_URL, flag="--env-url")]
        return Config(
            host=a.host, port=a.port, metrics_port=a.metrics_port, tasks=tasks, settings=settings,
            env_urls=env_urls,
            reward_url=podenv.pick(a.reward_url, environ, podenv.REWARD_URL, flag="--reward-url"),
            placement=podenv.pick(a.placement, environ, podenv.PLACEMENT_ADDR, flag="--placement"),
            buffer=podenv.pick(a.buffer, environ, podenv.BUFFER_ADDR, flag="--buffer"),
        )  # fmt: skip

    return podenv.or_exit(build, prog=PROG)


def expand_headless(url: str) -> list[str]:
    """One URL per address the host resolves to.

    The env Service is headless: a session lives in one pod, so every pod needs its own client
    (a single URL would let DNS scatter one session's steps). Resolved once at startup; pods added
    later are not used until the scheduler restarts.
    """
    parts = urllib.parse.urlsplit(url)
    host, port = parts.hostname or "", parts.port
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError:
        return [url]  # not resolvable yet: the env client retries through the name
    addresses = sorted({str(info[4][0]) for info in infos if info[0] == socket.AF_INET})
    if len(addresses) <= 1:
        return [url]
    return [parts._replace(netloc=f"{address}:{port}").geturl() for address in addresses]


class AgentPool:
    """One ``AgentClient`` per worker address, created on first use."""

    def __init__(self) -> None:
        self.clients: dict[str, agent_client.AgentClient] = {}

    def __call__(self, address: str) -> agent_client.AgentClient:
        client = self.clients.get(address)
        if client is None:
            client = self.clients[address] = agent_client.AgentClient(address)
        return client

    async def aclose(self) -> None:
        for client in self.clients.values():
            await client.aclose()


async def main(cfg: Config) -> None:
    tasks = {t.name: t for t in cfg.tasks}
    envs = [env_client.EnvClient(url) for given in cfg.env_urls for url in expand_headless(given)]
    agents = AgentPool()
    reward = reward_client.RewardClient(cfg.reward_url)
    placement = placement_client.PlacementClient(cfg.placement)
    buffer = buffer_client.BufferClient(cfg.buffer)
    svc = service.SchedulerService(
        tasks=tasks, settings=cfg.settings, envs=envs, agent_for=agents,
        placement=placement, reward=reward, buffer=buffer,
    )  # fmt: skip
    if cfg.metrics_port:
        prom.start_http_server(cfg.metrics_port, addr=cfg.host, registry=svc.registry)
    served = await grpc_server.build_server(svc, host=cfg.host, port=cfg.port)
    runtime.settle_heap()
    logging.info("scheduler serving on %s:%d (%d env servers)", cfg.host, served.port, len(envs))

    async def close() -> None:
        await svc.aclose()
        for env in envs:
            await env.aclose()
        await agents.aclose()
        await reward.aclose()
        await placement.aclose()
        await buffer.aclose()

    reporter = demand.RewardDemandReporter.from_env(os.environ)
    reporting = (
        asyncio.create_task(report_demand(svc, reporter, interval_s=DEMAND_INTERVAL_S), name="reward demand")
        if reporter is not None
        else None
    )

    async def stop() -> None:
        if reporting is not None and reporter is not None:
            reporting.cancel()
            await asyncio.gather(reporting, return_exceptions=True)
            await reporter.aclose()
        await close()

    await grpcutil_server.serve_forever(served, on_stop=stop)


async def report_demand(
    svc: service.SchedulerService, reporter: demand.RewardDemandReporter, *, interval_s: float
) -> None:
    """Report the reward backlog until cancelled (the reporter only patches on change)."""
    log.info("reporting reward demand on %s/%s every %.1fs", reporter.namespace, reporter.job, interval_s)
    while True:
        await reporter.report(svc.reward_backlog())
        await asyncio.sleep(interval_s)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    asyncio.run(main(parse_args()))
