"""``python -m treadle.trainer.job``: the reference GRPO trainer inside a RolloutJob (``spec.trainer``).

The operator runs it as the job's trainer Job (``treadle.operator.render.trainer``). Everything comes
from the pod: the job file (``TREADLE_CONFIG``: steps, learning rate, clipping from ``spec.trainer``;
batch size and staleness from ``spec.rollout``; the trained agent's model, through
``jobconfig.TrainerConfig``) and the SDK's endpoints (``treadle.client.connect``). It trains
``loop.Trainer`` for the configured steps, with the scheduler as the gate and the job's inference
workers as the swapper, and exits 0; prompts come from the job's feeder, never from here.

The policy model is the agent's ``model``: a local folder, or a Hugging Face id in the local cache
(``weights.loader.model_dir``, the same checkpoint the engines validate published versions
against). A path whose folder is named ``tiny-llama-seed<N>`` (``treadle.trainer.policy.model_dir``)
and holds no model yet is generated there first, deterministically from N
(``treadle.models.tiny``): the dev cluster's tiny Llama needs no download.

The swapper (``PlacementSwapper``) reads the job's inference workers from placement before every
prefetch and swap (a restarted worker registers again under a new address) and swaps them through
their agents, as ``treadle train``'s local stack does (``engines.EngineSwapper``). Seam: when
placement drives swaps itself (its ``SwapWeights`` RPC and ``treadle.client.swapper.ClusterSwapper``,
another branch), ``swapper()`` below is the one place that changes.

A restarted trainer continues the version numbers (it starts at the scheduler's committed version
and publishes after the newest version in the store) but trains again from the base checkpoint:
optimizer state and weights are not checkpointed yet, and its steps count from 1 again.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import logging
import os
import re
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from treadle import errors
from treadle.api import env_vars, jobconfig
from treadle.client import connect
from treadle.services import podenv
from treadle.services.placement import client as placement_client
from treadle.trainer import engines, grpo, loop, policy
from treadle.weights import loader

PROG = "python -m treadle.trainer.job"
TINY_MODEL = re.compile(r"tiny-llama-seed(\d+)")
log = logging.getLogger(__name__)


def model_path(model: str) -> Path:
    """The checkpoint folder of ``model``, generating the tiny Llama its name asks for if missing."""
    path = Path(model)
    tiny = TINY_MODEL.fullmatch(path.name)
    if path.is_absolute() and tiny is not None:
        return policy.ensure_model(path, seed=int(tiny.group(1)))
    return loader.model_dir(model)


def loop_config(cfg: jobconfig.TrainerConfig) -> loop.Config:
    return loop.Config(
        steps=cfg.steps, batch_size=cfg.batch_size, lr=cfg.lr, temperature=cfg.temperature,
        loss=grpo.LossConfig(clip_low=cfg.clip_low, clip_high=cfg.clip_high),
        batch_timeout_s=cfg.batch_timeout_s,
    )  # fmt: skip


class PlacementSwapper:
    """``loop.Swapper`` over the job's workers as placement lists them, at every call."""

    def __init__(
        self, placement: placement_client.PlacementClient, *, pools: set[str], agent: str, apply_weights: bool
    ) -> None:
        self.placement = placement
        self.pools = pools
        """The trained agent's pools (a multi-agent job's other agents keep their own weights)."""
        self.agent = agent
        """The agent to name in each swap: set for a multi-agent job only (``EngineSwapper``)."""
        self.apply_weights = apply_weights
        self.served: dict[str, int] = {}
        """Version each worker serves, as of its last successful swap."""

    async def _engines(self) -> engines.EngineSwapper:
        state = await self.placement.pool_state()
        replicas = [
            engines.Replica(w.worker.worker_id, w.worker.engine_address, w.worker.address)
            for w in state.workers
            if w.worker.pool in self.pools and w.worker.engine_address
        ]
        if not replicas:
            raise errors.Unavailable(f"no inference worker of pools {sorted(self.pools)} is registered")
        return engines.EngineSwapper(replicas, extension=self.apply_weights, agent=self.agent)

    async def prefetch(self, version: int) -> None:
        await (await self._engines()).prefetch(version)

    async def swap(self, version: int) -> None:
        swapper = await self._engines()
        try:
            await swapper.swap(version)
        finally:
            self.served |= {w: v for w, v in swapper.served.items() if v == version}


def swapper(
    conn: connect.Connection, job: jobconfig.JobConfig, agent: str, *, apply_weights: bool
) -> loop.Swapper:
    """The trainer's swapper in the job (the seam for placement-driven swaps, see the module doc)."""
    pools = {pool for pool, a in job.placement.pool_agents.items() if a == agent}
    multi = len(set(job.placement.pool_agents.values())) > 1
    return PlacementSwapper(
        conn.placement, pools=pools, agent=agent if multi else "", apply_weights=apply_weights
    )


async def run(
    environ: Mapping[str, str], *, apply_weights: bool = True, echo: Callable[[str], None] = print
) -> list[loop.StepRecord]:
    """Train the job's ``spec.trainer`` to its last step; returns one record per step."""
    job = podenv.job_config(environ)
    cfg = job.trainer
    if cfg is None:
        raise errors.SpecError("the job has no spec.trainer to run", field=f"{env_vars.CONFIG}:spec.trainer")
    if cfg.threads is not None:
        import torch

        torch.set_num_threads(cfg.threads)
    path = await asyncio.to_thread(model_path, cfg.model)
    pol = await asyncio.to_thread(policy.load, path)
    conn = connect.connect(keep_versions=cfg.alpha + 1, replicas=cfg.weights_replicas, environ=environ)
    try:
        # A restarted trainer goes on from the version the job committed, not from 0.
        conn.publisher.committed = (await conn.scheduler.stats()).version
        echo(
            f"[{PROG}] job {job.job}: agent {cfg.agent}, model {path}; {cfg.steps} steps of {cfg.batch_size} "
            f"trajectories, alpha {cfg.alpha}; from version {conn.publisher.committed}"
        )
        batches = conn.batches(
            batch_size=cfg.batch_size, timeout_s=cfg.batch_timeout_s, max_batches=cfg.steps
        )
        trainer = loop.Trainer(
            pol,
            batches=batches,
            publisher=conn.publisher,
            gate=conn.scheduler,
            swapper=swapper(conn, job, cfg.agent, apply_weights=apply_weights),
            config=loop_config(cfg),
            echo=echo,
        )
        history = await trainer.run()
    finally:
        await conn.aclose()
    if history:
        echo(
            f"[{PROG}] mean reward {history[0].mean_reward:.3f} (step 1) -> {history[-1].mean_reward:.3f} "
            f"(step {history[-1].step}); version {history[-1].published} committed"
        )
    return history


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--no-apply-weights", action="store_true",
        help="swap only the engines' version labels (SIMULATED engines, which cannot load weights)",
    )  # fmt: skip
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    began = time.monotonic()
    try:
        # Flushed per line: stdout to a pod's log file is block-buffered, and `kubectl logs -f` showed
        # no step until the trainer exited (found on the dev cluster).
        echo = functools.partial(print, flush=True)
        asyncio.run(run(os.environ, apply_weights=not args.no_apply_weights, echo=echo))
    except errors.SpecError as exc:
        print(f"{PROG}: configuration error: {exc}", file=sys.stderr)
        return 2
    log.info("done in %.1fs", time.monotonic() - began)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
