"""``python -m treadle.services.placement``: run placement for the pools and tasks given as JSON."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging

import prometheus_client as prom

from treadle.services.grpcutil import server as grpcutil_server
from treadle.services.placement import grpc_server, service


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m treadle.services.placement", description=__doc__)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=50052)
    p.add_argument("--metrics-port", type=int, default=0, help="Prometheus /metrics port (0: none)")
    p.add_argument(
        "--pools", required=True, help='JSON object pool -> preferred work, e.g. {"decode": "decode-heavy"}'
    )
    p.add_argument(
        "--tasks",
        required=True,
        help='JSON object task -> {"affinity": "auto", "pools": []}, e.g. {"math": {}}',
    )
    p.add_argument(
        "--policy", default="sticky-least-loaded", help="placement policy (treadle.policy.registry)"
    )
    return p.parse_args(argv)


async def main(args: argparse.Namespace) -> None:
    tasks = {name: service.TaskPlacement(**spec) for name, spec in json.loads(args.tasks).items()}
    svc = service.PlacementService(pools=json.loads(args.pools), tasks=tasks, policy=args.policy)
    if args.metrics_port:
        prom.start_http_server(args.metrics_port, addr=args.host, registry=svc.registry)
    served = await grpc_server.build_server(svc, host=args.host, port=args.port)
    logging.info("placement serving on %s:%d", args.host, served.port)
    await grpcutil_server.serve_forever(served)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    asyncio.run(main(parse_args()))
