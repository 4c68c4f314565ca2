"""``treadle operator run``: the operator process (what the chart's Deployment runs)."""

from __future__ import annotations

import argparse
import importlib
import logging
from typing import Any

import kopf

from treadle.operator import config, kube, metrics, runtime


def register(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser("operator", help="run the RolloutJob operator")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    run = actions.add_parser("run", help="reconcile RolloutJobs until interrupted")
    scope = run.add_mutually_exclusive_group()
    scope.add_argument(
        "--namespace", "-n", action="append", default=[], help="watch this namespace (repeatable)"
    )
    scope.add_argument("--all-namespaces", "-A", action="store_true", help="watch every namespace (default)")
    run.add_argument("--kubeconfig", default=None, help="kubeconfig (default: in-cluster, else $KUBECONFIG)")
    run.add_argument("--bind", default="0.0.0.0", help="address of the metrics and liveness endpoints")
    run.add_argument("--metrics-port", type=int, default=9090, help="Prometheus metrics port (0: off)")
    run.add_argument("--liveness-port", type=int, default=8080, help="kopf liveness probe port (0: off)")
    run.add_argument("--verbose", "-v", action="store_true", help="debug logging")
    run.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    # Importing the handlers registers them with kopf, so do it only when actually running.
    importlib.import_module("treadle.operator.handlers")

    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    if not args.verbose:
        # Every pod event of every job runs child_changed; its success lines would drown the log.
        logging.getLogger("kopf.objects").addFilter(
            lambda record: not str(record.msg).startswith("Handler 'child_changed' succeeded")
        )
    memo = runtime.Runtime(
        kube=kube.Kube.from_environment(args.kubeconfig),
        kubeconfig=args.kubeconfig,
        cfg=config.OperatorConfig.from_env(),
        metrics=metrics.OperatorMetrics(),
        metrics_port=args.metrics_port or None,
        metrics_addr=args.bind,
    )
    liveness = f"http://{args.bind}:{args.liveness_port}/healthz" if args.liveness_port else None
    kopf.run(
        standalone=True,
        clusterwide=not args.namespace,
        namespaces=args.namespace,
        liveness_endpoint=liveness,
        memo=memo,
    )
    return 0
