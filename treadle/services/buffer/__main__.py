"""``python -m treadle.services.buffer``: run the buffer (embedded memory store, or Redis with --redis)."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging

import prometheus_client as prom

from treadle.services.buffer import grpc_server, redis_store, service, store
from treadle.services.grpcutil import server as grpcutil_server


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m treadle.services.buffer", description=__doc__)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=50053)
    p.add_argument("--metrics-port", type=int, default=0, help="Prometheus /metrics port (0: none)")
    p.add_argument("--redis", default="", help="Redis URL; empty for the embedded in-memory store")
    p.add_argument("--namespace", default="default", help="key namespace in Redis (one per job)")
    p.add_argument("--alpha", type=int, default=1, help="staleness bound in policy versions")
    p.add_argument("--task-weights", default="{}", help='JSON object task -> batch weight, e.g. {"math": 1}')
    p.add_argument("--lease-s", type=float, default=300.0, help="default lease before redelivery")
    return p.parse_args(argv)


async def main(args: argparse.Namespace) -> None:
    backend: store.Store = (
        redis_store.RedisStore.from_url(args.redis, namespace=args.namespace)
        if args.redis
        else store.MemoryStore()
    )
    svc = service.BufferService(
        store=backend,
        alpha=args.alpha,
        task_weights=json.loads(args.task_weights),
        default_lease_s=args.lease_s,
    )
    if args.metrics_port:
        prom.start_http_server(args.metrics_port, addr=args.host, registry=svc.registry)
    served = await grpc_server.build_server(svc, host=args.host, port=args.port)
    logging.info("buffer serving on %s:%d (%s)", args.host, served.port, "redis" if args.redis else "memory")
    await grpcutil_server.serve_forever(served, on_stop=backend.aclose)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    asyncio.run(main(parse_args()))
