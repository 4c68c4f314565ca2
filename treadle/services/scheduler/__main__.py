"""``python -m treadle.services.scheduler``: run the scheduler against env, reward, placement and buffer.

Tasks and settings come as JSON (local mode writes them from a RolloutJob); agents are reached at
the addresses placement hands out.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging

import prometheus_client as prom

from treadle.services.agent import client as agent_client
from treadle.services.buffer import client as buffer_client
from treadle.services.env import client as env_client
from treadle.services.grpcutil import server as grpcutil_server
from treadle.services.placement import client as placement_client
from treadle.services.reward import client as reward_client
from treadle.services.scheduler import grpc_server, protocol, service


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m treadle.services.scheduler", description=__doc__)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=50051)
    p.add_argument("--metrics-port", type=int, default=0, help="Prometheus /metrics port (0: none)")
    p.add_argument("--tasks", required=True, help="JSON list of TaskConfig fields, one object per task")
    p.add_argument("--settings", default="{}", help="JSON object of Settings fields")
    p.add_argument(
        "--env-url", action="append", required=True, help="environment server base URL (repeatable)"
    )
    p.add_argument("--reward-url", required=True)
    p.add_argument("--placement", required=True, help="placement gRPC address host:port")
    p.add_argument("--buffer", required=True, help="buffer gRPC address host:port")
    return p.parse_args(argv)


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


async def main(args: argparse.Namespace) -> None:
    tasks = {t["name"]: protocol.TaskConfig(**t) for t in json.loads(args.tasks)}
    envs = [env_client.EnvClient(url) for url in args.env_url]
    agents = AgentPool()
    reward = reward_client.RewardClient(args.reward_url)
    placement = placement_client.PlacementClient(args.placement)
    buffer = buffer_client.BufferClient(args.buffer)
    svc = service.SchedulerService(
        tasks=tasks, settings=protocol.Settings(**json.loads(args.settings)), envs=envs, agent_for=agents,
        placement=placement, reward=reward, buffer=buffer,
    )  # fmt: skip
    if args.metrics_port:
        prom.start_http_server(args.metrics_port, addr=args.host, registry=svc.registry)
    served = await grpc_server.build_server(svc, host=args.host, port=args.port)
    logging.info("scheduler serving on %s:%d", args.host, served.port)

    async def close() -> None:
        await svc.aclose()
        for env in envs:
            await env.aclose()
        await agents.aclose()
        await reward.aclose()
        await placement.aclose()
        await buffer.aclose()

    await grpcutil_server.serve_forever(served, on_stop=close)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    asyncio.run(main(parse_args()))
