"""``treadle cluster up|down|status``: the local control plane with fake H800/H20/CPU pools."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from treadle.devcluster import binaries, kwok, nodes


def register(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser(
        "cluster", help="run a local Kubernetes control plane with fake GPU node pools"
    )
    parser.add_argument("--name", default="treadle", help="cluster name (default: treadle)")
    parser.add_argument(
        "--kubeconfig", type=Path, default=Path.home() / ".kube" / "config",
        help="kubeconfig that receives the context and becomes current (default: ~/.kube/config)",
    )  # fmt: skip
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    up = actions.add_parser("up", help="create the cluster and its node pools (idempotent)")
    up.add_argument(
        "--nodes", type=int, default=None, help="total KWOK nodes, 0 for none (default: 2 per pool)"
    )
    up.add_argument(
        "--run-nodes", type=int, default=1,
        help="process nodes whose pods really run (node agent, needs root); 0: KWOK nodes only (default: 1)",
    )  # fmt: skip
    up.add_argument(
        "--run-gpu-nodes", type=int, default=0,
        help="process nodes with SIMULATED GPUs (capacity and labels only; default: 0)",
    )  # fmt: skip
    up.add_argument("--run-accelerator", default="H20", help="GPU class of those nodes (default: H20)")
    up.add_argument(
        "--run-gpus", type=int, default=8, help="nvidia.com/gpu of each of those nodes (default: 8)"
    )
    up.set_defaults(func=_up)
    actions.add_parser("down", help="stop every component and delete the cluster").set_defaults(func=_down)
    actions.add_parser("status", help="print nodes per pool").set_defaults(func=_status)


def _cluster(args: argparse.Namespace) -> kwok.DevCluster:
    pools = (
        nodes.DEFAULT_POOLS if args.nodes is None else nodes.scaled_pools(args.nodes) if args.nodes else ()
    )
    return kwok.DevCluster(
        name=args.name, pools=pools, user_kubeconfig=args.kubeconfig, run_nodes=args.run_nodes,
        run_gpu_nodes=args.run_gpu_nodes, run_accelerator=args.run_accelerator, run_gpus=args.run_gpus,
    )  # fmt: skip


def _up(args: argparse.Namespace) -> int:
    started = time.monotonic()
    try:
        cluster = _cluster(args)
        cluster.up()
    except (binaries.ToolMissing, kwok.ClusterError, ValueError) as exc:
        print(f"treadle cluster up: {exc}", file=sys.stderr)
        return 1
    print(f"cluster {cluster.context!r} ready in {time.monotonic() - started:.1f}s; "
          f"context added to {args.kubeconfig}")  # fmt: skip
    _print_pools(cluster)
    if cluster.run_node_names():
        print(
            f"pods on the process nodes run as local processes; container logs under {cluster.agent_dir}/pods"
        )
    return 0


def _down(args: argparse.Namespace) -> int:
    try:
        kwok.DevCluster(name=args.name, user_kubeconfig=args.kubeconfig).down()
    except (binaries.ToolMissing, kwok.ClusterError) as exc:
        print(f"treadle cluster down: {exc}", file=sys.stderr)
        return 1
    print(f"cluster {args.name!r} deleted; no process left")
    return 0


def _status(args: argparse.Namespace) -> int:
    cluster = kwok.DevCluster(name=args.name, user_kubeconfig=args.kubeconfig)
    if not cluster.is_up():
        print(f"cluster {args.name!r} is not running")
        return 1
    _print_pools(cluster)
    return 0


def _print_pools(cluster: kwok.DevCluster) -> None:
    for pool, names in sorted(cluster.nodes_by_pool().items()):
        shown = ", ".join(names[:4]) + (" ..." if len(names) > 4 else "")
        print(f"  pool {pool:<7} {len(names):>3} nodes: {shown}")
