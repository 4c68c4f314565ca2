"""``python -m treadle.trainer.job``: the reference GRPO trainer inside a RolloutJob (``spec.trainer``).

The operator runs it as the job's trainer Job (``treadle.operator.render.trainer``). Everything comes
from the pod: the job file (``TREADLE_CONFIG``: steps, learning rate, clipping from ``spec.trainer``;
batch size and staleness from ``spec.rollout``; the trained agent's model, through
``jobconfig.TrainerConfig``) and the SDK's endpoints (``treadle.client.connect``). It trains
``loop.Trainer`` for the configured steps, with the scheduler as the gate and the job's inference
workers as the swapper, and exits 0; prompts come from the job's feeder, never from here.

The policy model is the agent's ``model``: a local folder, or a Hugging Face id in the local cache
(``weights.loader.model_dir``, the same checkpoint the engines validate published versions
against). A path whose folder is named ``tiny-llama-seed<N>`` or ``tiny-qwen3-seed<N>``
(``treadle.trainer.policy.model_dir``) and holds no model yet is generated there first,
deterministically from N (``treadle.models.tiny``): the dev cluster's tiny Llama needs no download.

Every rank of the trainer runs this module (``torchrun`` starts them when the operator renders a
group, ``docs/TRAINING.md``): each loads the model and shards it (``treadle.trainer.parallel``); rank
0 talks to the job's services and leads, the others follow it (``treadle.trainer.group``).

Weights are swapped by the job's own services: the trainer asks placement to prefetch and then swap
a published version (``treadle.client.swapper.ClusterSwapper`` over placement's ``PrefetchWeights``
/ ``SwapWeights``), and placement fans it out to every registered worker of the trained agent through
their agents (RollArt's suspend, pull, apply under pause, resume; ``docs/WEIGHT_SYNC.md``). Whether
the engines load real weights is placement's setting (``--[no-]apply-weights``), not the trainer's.

A restarted trainer (its pod deleted, evicted or crashed) goes on where the job is: from the
scheduler's committed version and step, with the weights of that version pulled from the job's
weight store (every committed version stays there until it leaves the staleness window), training
only the steps left and publishing after the newest version in the store. Adam's state of that
version comes back too (``treadle.trainer.checkpoint``: published beside each version, before it is
committed), so its next update is the one an uninterrupted trainer would have made.
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

import prometheus_client
import torch
import torch.distributed as dist

from treadle import errors
from treadle.api import env_vars, jobconfig
from treadle.client import connect
from treadle.client import swapper as swapper_mod
from treadle.services import podenv
from treadle.trainer import checkpoint, exporter, group, grpo, loop, parallel, policy, step, tracking
from treadle.weights import loader

PROG = "python -m treadle.trainer.job"
TINY_MODEL = re.compile(r"tiny-(llama|qwen3)-seed(\d+)")
log = logging.getLogger(__name__)


def model_path(model: str) -> Path:
    """The checkpoint folder of ``model``, generating the tiny Llama or Qwen3 its name asks for if
    missing (``tiny-<arch>-seed<N>``)."""
    path = Path(model)
    tiny = TINY_MODEL.fullmatch(path.name)
    if path.is_absolute() and tiny is not None:
        return policy.ensure_model(path, seed=int(tiny.group(2)), arch=tiny.group(1))
    return loader.model_dir(model)


def loop_config(cfg: jobconfig.TrainerConfig, *, steps_done: int = 0) -> loop.Config:
    return loop.Config(
        steps=cfg.steps, batch_size=cfg.batch_size, batch_timeout_s=cfg.batch_timeout_s, steps_done=steps_done
    )


def step_settings(cfg: jobconfig.TrainerConfig) -> step.Settings:
    return step.Settings(
        temperature=cfg.temperature, loss=grpo.LossConfig(clip_low=cfg.clip_low, clip_high=cfg.clip_high),
        micro_batch_tokens=cfg.micro_batch_tokens, max_grad_norm=cfg.max_grad_norm,
    )  # fmt: skip


def load_sharded(cfg: jobconfig.TrainerConfig, world: parallel.World) -> tuple[Path, policy.Policy]:
    """The agent's model on every rank, sharded. One process per pod generates a missing tiny model
    (the others wait at a barrier), so ranks never write one folder at once."""
    if world.local_rank == 0:
        path = model_path(cfg.model)
    dist.barrier(group=world.objects)
    if world.local_rank != 0:
        path = model_path(cfg.model)
    pol = policy.load(path)
    parallel.shard(pol.model, world, bf16=cfg.bf16, checkpointing=cfg.activation_checkpointing)
    return path, pol


def swapper(conn: connect.Connection, job: jobconfig.JobConfig, agent: str) -> loop.Swapper:
    """Placement's weight sync for the trained agent's workers ("" names a single-agent job's)."""
    multi = len(set(job.placement.pool_agents.values())) > 1
    return swapper_mod.ClusterSwapper(conn.placement, agent=agent if multi else "")


async def run(environ: Mapping[str, str], *, echo: Callable[[str], None] = print) -> list[loop.StepRecord]:
    """Train the job's ``spec.trainer`` to its last step on this rank; returns rank 0's step records
    (the other ranks follow rank 0 and return none)."""
    job = podenv.job_config(environ)
    cfg = job.trainer
    if cfg is None:
        raise errors.SpecError("the job has no spec.trainer to run", field=f"{env_vars.CONFIG}:spec.trainer")
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    world = parallel.init(dict(environ))
    try:
        path, pol = await asyncio.to_thread(load_sharded, cfg, world)
        conn = connect.connect(keep_versions=cfg.alpha + 1, replicas=cfg.weights_replicas, environ=environ)
        try:
            learner = group.Group(
                world, pol, lr=cfg.lr, settings=step_settings(cfg), weights=conn.weights,
                optimizer_store=checkpoint.OptimizerStore(
                    conn.weights.store, conn.weights.prefix, keep_versions=cfg.alpha + 1
                ),
            )  # fmt: skip
            if not world.leader:
                await _follow(learner)
                return []
            return await _lead(job, cfg, conn, learner, path, environ=environ, echo=echo)
        finally:
            await conn.aclose()
    finally:
        parallel.close()


async def _follow(learner: group.Group) -> None:
    """A rank other than 0: resume as rank 0 says, then run its steps."""
    version = parallel.broadcast(None, learner.world)
    if version > 0:
        await asyncio.to_thread(learner.resume, version)
    await asyncio.to_thread(learner.follow)


async def _lead(
    job: jobconfig.JobConfig,
    cfg: jobconfig.TrainerConfig,
    conn: connect.Connection,
    learner: group.Group,
    path: Path,
    *,
    environ: Mapping[str, str],
    echo: Callable[[str], None],
) -> list[loop.StepRecord]:
    """Rank 0: the services' side of training, every rank's steps through ``learner``."""
    world = learner.world
    registry = prometheus_client.CollectorRegistry()
    step_metrics = exporter.StepMetrics(registry, ranks=world.size)
    podenv.serve_metrics(registry, "0.0.0.0", podenv.metrics_port(environ))
    # A restarted trainer goes on from the version the job committed, not from 0. The trainer's
    # pod may start before the scheduler's Service name resolves: waited for, not a restart.
    what = f"the scheduler at {conn.endpoints.scheduler}"
    at = await connect.wait_for(conn.scheduler.stats, what=what)
    conn.publisher.committed, steps_done = at.version, min(at.step, cfg.steps)
    echo(
        f"[{PROG}] job {job.job}: agent {cfg.agent}, model {path}; {cfg.steps} steps of {cfg.batch_size} "
        f"trajectories, alpha {cfg.alpha}; {world.size} rank(s) on {world.device.type}; "
        f"from version {conn.publisher.committed}"
    )
    done = steps_done >= cfg.steps
    version = 0 if done else conn.publisher.committed
    parallel.broadcast(version, world)
    trackers = tracking.Trackers()
    try:
        if done:
            echo(f"[{PROG}] the job committed its last step ({steps_done}) already: nothing to train")
            return []
        if version > 0:
            restored = await asyncio.to_thread(learner.resume, version)
            echo(f"[{PROG}] resumed from version {version}'s weights, after step {steps_done}")
            echo(
                f"[{PROG}] resumed Adam's state of version {version}"
                if restored
                else f"[{PROG}] version {version} has no optimizer state in the store: Adam starts from zero"
            )
        # After the resume, a collective: a tracker failing to start stops the followers cleanly.
        trackers = tracking.start(cfg, run=job.job)

        def observe(record: loop.StepRecord) -> None:
            step_metrics.observe(record)
            trackers.log(record)

        trainer = loop.Trainer(
            learner,
            batches=conn.batches(
                batch_size=cfg.batch_size, timeout_s=cfg.batch_timeout_s, max_batches=cfg.steps - steps_done,
                acks="explicit",
            ),
            publisher=conn.publisher,
            gate=conn.scheduler,
            swapper=swapper(conn, job, cfg.agent),
            config=loop_config(cfg, steps_done=steps_done),
            echo=echo,
            observe=observe,
        )  # fmt: skip
        history = await trainer.run()
    finally:
        await asyncio.to_thread(learner.stop)
        trackers.close()
    if history:
        echo(
            f"[{PROG}] mean reward {history[0].mean_reward:.3f} (step {history[0].step}) -> "
            f"{history[-1].mean_reward:.3f} "
            f"(step {history[-1].step}); version {history[-1].published} committed"
        )
    return history


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    began = time.monotonic()
    try:
        # Flushed per line: stdout to a pod's log file is block-buffered, and `kubectl logs -f` showed
        # no step until the trainer exited (found on the dev cluster).
        asyncio.run(run(os.environ, echo=functools.partial(print, flush=True)))
    except errors.SpecError as exc:
        print(f"{PROG}: configuration error: {exc}", file=sys.stderr)
        return 2
    log.info("done in %.1fs", time.monotonic() - began)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
