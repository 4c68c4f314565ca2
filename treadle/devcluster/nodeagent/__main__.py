"""``python -m treadle.devcluster.nodeagent``: the process nodes of one dev cluster (run as root).

Started by ``treadle cluster up`` (``DevCluster.up``); logs to stderr, stops on SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path

import yaml

import treadle
from treadle.devcluster.nodeagent import agent, images


def parse(argv: list[str]) -> agent.Settings:
    p = argparse.ArgumentParser(prog="python -m treadle.devcluster.nodeagent", description=__doc__)
    p.add_argument("--cluster", required=True, help="dev cluster name (names its bridge and namespaces)")
    p.add_argument("--kubeconfig", required=True, type=Path, help="the cluster's admin kubeconfig")
    p.add_argument("--state-dir", required=True, type=Path, help="pods' volumes and container logs")
    p.add_argument("--node", action="append", default=[], help="a CPU process node's name (repeatable)")
    p.add_argument("--gpu-node", action="append", default=[], help="a SIMULATED GPU node's name (repeatable)")
    p.add_argument("--cpu", default="16", help="each node's cpu capacity (default 16)")
    p.add_argument("--memory", default="64Gi", help="each node's memory capacity (default 64Gi)")
    p.add_argument("--accelerator", default="H20", help="GPU class of the --gpu-node nodes (default H20)")
    p.add_argument("--gpus", type=int, default=8, help="nvidia.com/gpu of each --gpu-node node (default 8)")
    p.add_argument("--tls-cert", required=True, type=Path, help="certificate of the log endpoint")
    p.add_argument("--tls-key", required=True, type=Path, help="its private key")
    p.add_argument("--initial-backoff", type=float, default=10.0, help="seconds before the 2nd restart")
    args = p.parse_args(argv)
    kubeconfig = yaml.safe_load(args.kubeconfig.read_text())
    if not args.node and not args.gpu_node:
        p.error("name at least one --node or --gpu-node")
    specs = tuple(agent.NodeSpec(name=n, cpu=args.cpu, memory=args.memory) for n in args.node)
    specs += tuple(
        agent.NodeSpec(name=n, cpu=args.cpu, memory=args.memory, accelerator=args.accelerator, gpus=args.gpus)
        for n in args.gpu_node
    )
    return agent.Settings(
        cluster=args.cluster, kubeconfig=str(args.kubeconfig), state_dir=args.state_dir, nodes=specs,
        api_port=agent.api_port(kubeconfig), host=images.Host(
            venv_bin=str(Path(sys.executable).parent), source_root=str(Path(treadle.__file__).parents[1])
        ),
        initial_backoff_s=args.initial_backoff, tls_cert=args.tls_cert, tls_key=args.tls_key,
    )  # fmt: skip


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per probe otherwise
    asyncio.run(agent.serve(parse(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
