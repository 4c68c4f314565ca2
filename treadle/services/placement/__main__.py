"""``python -m treadle.services.placement``: run placement for a job's pools and tasks.

A pod started by the operator (and local mode, the same way) takes pools, tasks, the policy and the
rebalancing settings (``spec.rollout.rebalance``) from the job file (``treadle.services.podenv``);
a process started by hand writes a job file too (``podenv.job_env``). A job with several agents runs
inter-agent rebalancing (``rebalance.Rebalancer``) every ``spec.rollout.rebalance.intervalSeconds``
unless its ``enabled`` is false (or unset with no two agents of one instance shape).

A move loads the receiver's weights into the moved engine (``--apply-weights``, the default) in a
cluster, where the operator renders real vLLM with the weights extension and the job's weight
store; local mode's simulated engines only take the label (``--no-apply-weights``). The same swapper
serves the trainer's weight sync (``SwapWeights``, ``weightsync.WeightSync``); the job's
``spec.rollout.staleness`` keeps turns off workers too far behind the version they should serve.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
from collections.abc import Mapping

from treadle.api import env_vars, jobconfig
from treadle.policy.flexmarl import load_balance
from treadle.services import podenv, runtime
from treadle.services.grpcutil import server as grpcutil_server
from treadle.services.placement import grpc_server, rebalance, service, weightsync

PROG = "python -m treadle.services.placement"
LOST_AFTER_S = 10.0
"""Twenty missed load reports: a deleted pod's agent, not a slow one (``PlacementService.lost``)."""


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
    lost_after_s: float
    token: str | None


def parse_args(argv: list[str] | None = None, environ: Mapping[str, str] = os.environ) -> Config:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=50052)
    p.add_argument(
        "--metrics-port", type=int, help=f"Prometheus /metrics port (${env_vars.METRICS_PORT}; 0: none)"
    )
    p.add_argument(
        "--apply-weights", action=argparse.BooleanOptionalAction, default=True,
        help="a moved engine loads the receiver's weights (real vLLM with a weight store, as in a "
        "cluster); local mode's simulated engines pass --no-apply-weights",
    )  # fmt: skip
    p.add_argument(
        "--swap-timeout-s", type=float, default=300.0,
        help="one worker's weight swap (a move's, or a try of SwapWeights) at most",
    )  # fmt: skip
    p.add_argument(
        "--lost-after-s", type=float, default=LOST_AFTER_S,
        help="a worker whose agent has not reported this long is lost: no turns, and weight sync does "
        "not wait for it (agents report every 0.5 s)",
    )  # fmt: skip
    a = p.parse_args(argv)
    if not a.lost_after_s > 0:
        p.error(f"--lost-after-s must be > 0, got {a.lost_after_s}")
    job = podenv.Job(environ)

    def build() -> Config:
        cfg = job.config.placement
        rb = cfg.rebalance
        return Config(host=a.host, port=a.port, pools=cfg.pools, tasks=cfg.tasks,
                      metrics_port=podenv.metrics_port(environ, a.metrics_port),
                      policy=cfg.policy, pool_agents=cfg.pool_agents, pool_shapes=cfg.pool_shapes,
                      rebalance_interval_s=rb.interval_s, rebalance_delta=rb.delta,
                      rebalance_settle_polls=rb.settle_polls, rebalance_rule=rb.rule,
                      rebalance_step=rb.max_moves_per_poll, apply_weights=a.apply_weights,
                      alpha=cfg.alpha, swap_timeout_s=a.swap_timeout_s,
                      lost_after_s=a.lost_after_s, token=podenv.token(environ))  # fmt: skip

    return podenv.or_exit(build, prog=PROG)


async def main(cfg: Config) -> None:
    svc = service.PlacementService(
        pools=cfg.pools, tasks=cfg.tasks, policy=cfg.policy, pool_agents=cfg.pool_agents,
        pool_shapes=cfg.pool_shapes, rebalance_delta=cfg.rebalance_delta, rebalance_rule=cfg.rebalance_rule,
        rebalance_step=cfg.rebalance_step, alpha=cfg.alpha, lost_after_s=cfg.lost_after_s,
    )  # fmt: skip
    swapper = rebalance.HttpSwapper(
        apply_weights=cfg.apply_weights, timeout_s=cfg.swap_timeout_s, token=cfg.token
    )
    sync = weightsync.WeightSync(svc, swapper, apply_weights=cfg.apply_weights)
    podenv.serve_metrics(svc.registry, cfg.host, cfg.metrics_port)
    served = await grpc_server.build_server(svc, host=cfg.host, port=cfg.port, sync=sync, token=cfg.token)
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
