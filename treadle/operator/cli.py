"""``treadle operator run``: the operator process (what the chart's Deployment runs);
``treadle operator reshape``: apply a Heddle TP plan to a RolloutJob's pools (``reshape``).
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import sys
from pathlib import Path
from typing import Any

import kopf
import kubernetes
import yaml

from treadle.errors import SpecError
from treadle.operator import config, kube, metrics, reshape, runtime


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
    rs = actions.add_parser(
        "reshape",
        help="apply a TP plan (replicas per tensor-parallel degree) to one agent's pools of a job",
        description="Patch spec.pools of a RolloutJob from a plan file; the operator then rolls "
        "only the pools that changed. Plan file (YAML or JSON): "
        "{agent: NAME, accelerator: H800 (optional), replicas: {TP: REPLICAS, ...}}.",
    )
    rs.add_argument("job", help="RolloutJob name")
    rs.add_argument("--plan", required=True, type=Path, help="plan file (YAML or JSON)")
    rs.add_argument("--namespace", "-n", default="default", help="the job's namespace")
    rs.add_argument("--kubeconfig", default=None, help="kubeconfig (default: in-cluster, else $KUBECONFIG)")
    rs.add_argument("--dry-run", action="store_true", help="print the change and the patch, write nothing")
    rs.set_defaults(func=_reshape)


def _run(args: argparse.Namespace) -> int:
    cfg = config.OperatorConfig.from_env()
    if not cfg.auth_key:
        # Every job's token and Redis password derive from it: without it they would be guessable.
        print("treadle operator run: TREADLE_AUTH_KEY is not set (the chart sets it from its Secret "
              "<release>-treadle-auth-key; see docs/SECURITY.md)", file=sys.stderr)  # fmt: skip
        return 2
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
        cfg=cfg,
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


def _reshape(args: argparse.Namespace) -> int:
    try:
        plan = reshape.parse_plan(yaml.safe_load(args.plan.read_text()))
        client = kube.Kube.from_environment(args.kubeconfig, pool_size=1)
    except (SpecError, OSError, yaml.YAMLError, kubernetes.config.ConfigException) as exc:
        print(f"treadle operator reshape: {exc}", file=sys.stderr)
        return 2
    try:
        job = client.get_job(args.namespace, args.job)
        pools = reshape.new_pools(job, plan, gpus_per_node=client.gpus_per_node())
        ops = reshape.json_patch(job, pools)
        changes = reshape.describe(job["spec"]["pools"], pools)
        for line in changes or ["no pool changes"]:
            print(f"{args.namespace}/{args.job} {line}")
        if args.dry_run:
            print(json.dumps(ops, indent=2))
        elif changes:
            client.patch_job(args.namespace, args.job, ops)
    except SpecError as exc:
        print(f"treadle operator reshape: {exc}", file=sys.stderr)
        return 2
    except kubernetes.client.ApiException as exc:
        # 422 from the ``test`` operation: the pools changed between our read and our write.
        why = "the job's pools changed meanwhile; run again" if exc.status == 422 else exc.reason
        print(f"treadle operator reshape: API {exc.status}: {why}", file=sys.stderr)
        return 1
    finally:
        client.close()
    return 0
