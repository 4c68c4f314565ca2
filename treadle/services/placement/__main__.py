"""``python -m treadle.services.placement``: run placement for a job's pools and tasks.

A pod started by the operator (and local mode, the same way) takes pools, tasks, the policy and the
rebalancing settings (``spec.rollout.rebalance``) from the job file (``treadle.services.podenv``);
flags override (a bare placement without a job takes them all). A job with several agents runs
inter-agent rebalancing (``rebalance.Rebalancer``) every ``--rebalance-interval-s`` unless that is 0
(the job's ``rebalance.enabled`` false, or unset with no two agents of one instance shape).

A move loads the receiver's weights into the moved engine (``--apply-weights``) by default in a
cluster, where the operator renders real vLLM with the weights extension and the job's weight
store; local mode's simulated engines only take the label (``--no-apply-weights``, the default
without a job). The same swapper serves the trainer's weight sync (``SwapWeights``,
``weightsync.WeightSync``); ``--staleness`` (the job's ``spec.rollout.staleness``) keeps turns off
workers too far behind the version they should serve.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
from collections.abc import Mapping
from typing import TypeVar

import prometheus_client as prom

from treadle.api import jobconfig, v1alpha1
from treadle.policy import registry
from treadle.policy.flexmarl import load_balance
from treadle.services import podenv, runtime
from treadle.services.grpcutil import server as grpcutil_server
from treadle.services.placement import grpc_server, rebalance, service, weightsync

PROG = "python -m treadle.services.placement"
T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Config:
    host: str
    port: int
    metrics_port: int
    pools: dict[str, str]
    tasks: dict[str, jobconfig.TaskPlacement]
    policy: str
    pool_agents: dict[str, str]
    pool_shapes: dict[str, str]
    rebalance_interval_s: float
    rebalance_delta: float
    rebalance_settle_polls: int
    rebalance_rule: load_balance.Rule
    rebalance_step: int
    apply_weights: bool
    alpha: int | None
    swap_timeout_s: float


def parse_args(argv: list[str] | None = None, environ: Mapping[str, str] = os.environ) -> Config:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=50052)
    p.add_argument("--metrics-port", type=int, default=0, help="Prometheus /metrics port (0: none)")
    p.add_argument("--pools", help='JSON object pool -> preferred work, e.g. {"decode": "decode-heavy"}')
    p.add_argument("--tasks", help='JSON object task -> {"affinity": "auto", "pools": []}, e.g. {"math": {}}')
    p.add_argument("--policy", help="placement policy (treadle.policy.registry)")
    p.add_argument("--pool-agents", help="JSON object pool -> agent it serves (the job's)")
    p.add_argument("--pool-shapes", help="JSON object pool -> instance shape; moves stay within a shape")
    # Each defaults to the job's spec.rollout.rebalance (v1alpha1.Rebalance's defaults without a job).
    p.add_argument(
        "--rebalance-interval-s", type=float,
        help="seconds between inter-agent rebalance polls (several agents only; 0: never)",
    )  # fmt: skip
    p.add_argument("--rebalance-delta", type=float)
    p.add_argument(
        "--rebalance-settle-polls",
        type=int,
        help="polls skipped after a move, while the queues it changes drain",
    )
    p.add_argument("--rebalance-rule", choices=["literal", "per-instance"])
    p.add_argument("--rebalance-step", type=int, help="workers moved per poll at most (0: the rule's k)")
    p.add_argument(
        "--apply-weights", action=argparse.BooleanOptionalAction,
        help="a moved engine loads the receiver's weights (real vLLM with a weight store); default: "
        "on with a job (a cluster), off without (local mode's simulated engines)",
    )  # fmt: skip
    p.add_argument(
        "--staleness", type=int,
        help="no turn to a worker more than this many versions behind its agent's target; default: the "
        "job's spec.rollout.staleness (no bound without a job)",
    )  # fmt: skip
    p.add_argument(
        "--swap-timeout-s", type=float, default=300.0,
        help="one worker's weight swap (a move's, or a try of SwapWeights) at most",
    )  # fmt: skip
    a = p.parse_args(argv)
    job = podenv.Job(environ)

    def build() -> Config:
        # Without a job, the spec's defaults; bare placement rebalances whenever its pools name two agents.
        rb = (
            job.config.placement.rebalance
            if job.present
            else jobconfig.rebalance_config(v1alpha1.Rebalance(), enabled=True)
        )
        tasks = (
            {name: jobconfig.TaskPlacement(**spec) for name, spec in json.loads(a.tasks).items()}
            if a.tasks
            else job.config.placement.tasks
        )
        # Without a job (a bare process in a test), the registry's default policy.
        policy = a.policy or (job.config.placement.policy if job.present else registry.DEFAULT_PLACEMENT)
        pools = json.loads(a.pools) if a.pools else job.config.placement.pools
        pool_agents = json.loads(a.pool_agents) if a.pool_agents else (
            job.config.placement.pool_agents if job.present else {}
        )  # fmt: skip
        pool_shapes = json.loads(a.pool_shapes) if a.pool_shapes else (
            job.config.placement.pool_shapes if job.present else {}
        )  # fmt: skip
        return Config(host=a.host, port=a.port, metrics_port=a.metrics_port, pools=pools, tasks=tasks,
                      policy=policy, pool_agents=pool_agents, pool_shapes=pool_shapes,
                      rebalance_interval_s=_given(a.rebalance_interval_s, rb.interval_s),
                      rebalance_delta=_given(a.rebalance_delta, rb.delta),
                      rebalance_settle_polls=_given(a.rebalance_settle_polls, rb.settle_polls),
                      rebalance_rule=_given(a.rebalance_rule, rb.rule),
                      rebalance_step=_given(a.rebalance_step, rb.max_moves_per_poll),
                      apply_weights=_given(a.apply_weights, job.present),
                      alpha=_given(a.staleness, job.config.placement.alpha if job.present else None),
                      swap_timeout_s=a.swap_timeout_s)  # fmt: skip

    return podenv.or_exit(build, prog=PROG)


def _given(flag: T | None, default: T) -> T:
    """The flag when given (0 included), else the job's value."""
    return default if flag is None else flag


async def main(cfg: Config) -> None:
    svc = service.PlacementService(
        pools=cfg.pools, tasks=cfg.tasks, policy=cfg.policy, pool_agents=cfg.pool_agents,
        pool_shapes=cfg.pool_shapes, rebalance_delta=cfg.rebalance_delta, rebalance_rule=cfg.rebalance_rule,
        rebalance_step=cfg.rebalance_step, alpha=cfg.alpha,
    )  # fmt: skip
    swapper = rebalance.HttpSwapper(apply_weights=cfg.apply_weights, timeout_s=cfg.swap_timeout_s)
    sync = weightsync.WeightSync(svc, swapper, apply_weights=cfg.apply_weights)
    if cfg.metrics_port:
        prom.start_http_server(cfg.metrics_port, addr=cfg.host, registry=svc.registry)
    served = await grpc_server.build_server(svc, host=cfg.host, port=cfg.port, sync=sync)
    runtime.settle_heap()
    logging.info("placement serving on %s:%d", cfg.host, served.port)
    loop: asyncio.Task[None] | None = None
    if cfg.rebalance_interval_s > 0 and len(set(cfg.pool_agents.values())) > 1:
        if cfg.apply_weights:
            logging.info("inter-agent rebalancing every %.2fs", cfg.rebalance_interval_s)
        else:
            # Said at startup because a real engine would keep the donor's weights (docs/MULTI_AGENT.md).
            logging.warning(
                "inter-agent rebalancing every %.2fs without --apply-weights: a moved worker's engine "
                "is relabelled with the receiver's version, its weights are not reloaded",
                cfg.rebalance_interval_s,
            )
        rebalancer = rebalance.Rebalancer(
            svc, swapper, interval_s=cfg.rebalance_interval_s,
            settle_polls=cfg.rebalance_settle_polls,
        )  # fmt: skip
        loop = asyncio.create_task(rebalancer.run_forever(), name="rebalancer")
    try:
        await grpcutil_server.serve_forever(served)
    finally:
        if loop is not None:
            loop.cancel()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    asyncio.run(main(parse_args()))
