"""The reference GRPO trainer over the real services: batches in through the SDK, versions out.

Called by ``treadle train`` (``treadle.trainer.cli``) and the integration tests. One iteration is
RollArt's protocol (the digest's six steps, with the trainer's own update last so that it overlaps
the next rollout):

1. ``get_batch`` at the committed version (``treadle.client.batches.Batches``): the buffer evicts
   groups initiated more than alpha versions ago, so every sample trained on satisfies
   ``committed - init_version <= alpha``;
2. if the previous iteration published a version: suspend the scheduler (no new trajectories),
   swap that version into every engine (``engines.Swapper``), commit it (the scheduler aborts
   in-flight trajectories that became too stale), resume;
3. the GRPO step on the batch (on a worker thread, while rollout goes on with the new weights),
   then ``Publisher.publish`` writes the result as the next version; it is swapped in at step 2 of
   the next iteration.

So the engines run at most one version behind the trainer, and the batch at step t was generated
by versions in ``[t - 1 - alpha, t - 1]``; the per-token behaviour logprobs the engines recorded
correct for that in the clipped ratio (``grpo``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from treadle import errors
from treadle.client import batches as batches_mod
from treadle.client import publisher as publisher_mod
from treadle.client import retrying
from treadle.trainer import grpo
from treadle.trainer import step as step_mod
from treadle.weights import layout


class Gate(Protocol):
    """What the trainer needs from the scheduler around a swap."""

    async def suspend(self) -> object: ...

    async def resume(self) -> object: ...


class Swapper(Protocol):
    async def prefetch(self, version: int) -> None:
        """Start moving ``version`` toward the engines while they keep generating."""

    async def swap(self, version: int) -> None:
        """Make every engine serve ``version``; raises if any engine refused it."""


@dataclasses.dataclass(frozen=True)
class Stepped:
    stats: step_mod.StepStats
    manifest: layout.Manifest
    """The version the update was published as (committed in the store, not yet at the scheduler)."""
    train_s: float
    publish_s: float
    """Weights and optimizer state, every rank's part, up to the manifest."""


class Learner(Protocol):
    """The trainer's ranks (``treadle.trainer.group.Group``): one update, published (blocking)."""

    def step(self, batch: batches_mod.TrainBatch, version: int) -> Stepped: ...


@dataclasses.dataclass(frozen=True)
class Config:
    steps: int = 20
    batch_size: int = 32
    batch_timeout_s: float = 120.0
    restart_wait_s: float = 300.0
    """How long a scheduler or placement that does not answer (restarting) is waited for, per call."""
    steps_done: int = 0
    """Steps an earlier run of this trainer committed (a restart goes on after them, to ``steps``)."""

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size"):
            if getattr(self, name) < 1:
                raise errors.SpecError("must be >= 1", field=name, value=getattr(self, name))
        if not 0 <= self.steps_done < self.steps:
            raise errors.SpecError(f"must be in [0, {self.steps})", field="steps_done", value=self.steps_done)


@dataclasses.dataclass(frozen=True)
class StepRecord:
    step: int
    version: int
    """Committed version the batch was requested at (the engines served it while training ran)."""
    published: int
    """Version this step's weights were published as (swapped in before the next step)."""
    batch_id: str
    samples: int
    tokens: int
    """Output tokens trained on."""
    mean_reward: float
    staleness: int
    """Largest ``version - init_version`` over the batch's samples."""
    token_versions: tuple[int, int]
    """Oldest and newest policy version recorded on the batch's output tokens."""
    evicted_groups: int
    swap_s: float
    """Wall time of the suspend -> swap -> commit -> resume fence before this step."""
    train_s: float
    publish_s: float
    stats: grpo.LossStats
    aborted_on_commit: int
    wait_s: float = 0.0
    """Wall time waiting for this step's batch (after the previous step's training and fence)."""
    published_bytes: int = 0
    entropy: float = 0.0
    """Mean entropy of the policy at the batch's output tokens."""
    grad_norm: float = 0.0
    """Global gradient norm before clipping."""
    trained_tokens: int = 0
    """Prompt and output tokens put through the model (``trained_tokens / train_s``: tokens/s)."""


class Trainer:
    def __init__(
        self,
        learner: Learner,
        *,
        batches: batches_mod.Batches,
        publisher: publisher_mod.Publisher,
        gate: Gate,
        swapper: Swapper,
        config: Config,
        echo: Callable[[str], None] | None = None,
        observe: Callable[[StepRecord], None] | None = None,
    ) -> None:
        self.learner = learner
        self.batches = batches
        self.publisher = publisher
        self.gate = gate
        self.swapper = swapper
        self.config = config
        self.echo = echo
        self.observe = observe
        self.history: list[StepRecord] = []

    async def run(self) -> list[StepRecord]:
        """``config.steps`` iterations; the last published version is swapped in and committed too."""
        pending: StepRecord | None = None
        step = self.config.steps_done
        waiting = time.perf_counter()
        async for batch in self.batches:
            step += 1
            wait_s = time.perf_counter() - waiting
            version = self.publisher.committed
            swap_s, aborted = 0.0, 0
            if pending is not None:
                swap_s, aborted = await self._fence(pending)
                await self.batches.ack(pending.batch_id)
            pending = await self._train(step, version, batch, swap_s, aborted, wait_s)
            waiting = time.perf_counter()
            if step >= self.config.steps:
                break
        if pending is not None:
            await self._fence(pending)
            await self.batches.ack(pending.batch_id)
        return self.history

    async def _fence(self, record: StepRecord) -> tuple[float, int]:
        """Suspend -> swap -> commit -> resume the version ``record`` published; the scheduler resumes
        even if the swap fails. The commit carries the step and its batch's mean reward (the job's
        ``status.step`` and ``status.meanReward`` in a cluster)."""
        began = time.perf_counter()
        # Each call waits out a service being restarted (``Unavailable``, bounded): a trainer that died
        # with every scheduler or placement pod restart would lose its step and crash-loop.
        await retrying.wait_for(
            self.gate.suspend, what="the scheduler (Suspend)", timeout_s=self.config.restart_wait_s
        )
        try:
            await retrying.wait_for(
                lambda: self.swapper.swap(record.published),
                what="placement (SwapWeights)",
                timeout_s=self.config.restart_wait_s,
            )
            committed = await retrying.wait_for(
                lambda: self.publisher.commit(
                    record.published, step=record.step, mean_reward=record.mean_reward
                ),
                what="the scheduler (CommitVersion)",
                timeout_s=self.config.restart_wait_s,
            )
        finally:
            await retrying.wait_for(
                self.gate.resume, what="the scheduler (Resume)", timeout_s=self.config.restart_wait_s
            )
        return time.perf_counter() - began, len(committed.aborted_trajectory_ids)

    async def _train(
        self,
        step: int,
        version: int,
        batch: batches_mod.TrainBatch,
        swap_s: float,
        aborted: int,
        wait_s: float,
    ) -> StepRecord:
        done = await asyncio.to_thread(self.learner.step, batch, self.publisher.next_version())
        manifest = done.manifest
        await retrying.wait_for(
            lambda: self.swapper.prefetch(manifest.version),
            what="placement (PrefetchWeights)",
            timeout_s=self.config.restart_wait_s,
        )
        stats, result = done.stats.loss, done.stats
        record = StepRecord(
            step=step, version=version, published=manifest.version, batch_id=batch.batch_id,
            samples=len(batch.samples), tokens=stats.tokens,
            mean_reward=_mean(batch.rewards), evicted_groups=batch.evicted_groups,
            staleness=max((version - s.init_version for s in batch.samples), default=0),
            token_versions=_token_versions(batch),
            swap_s=swap_s, train_s=done.train_s, publish_s=done.publish_s, stats=stats,
            aborted_on_commit=aborted, wait_s=wait_s, published_bytes=manifest.total_bytes,
            entropy=result.entropy, grad_norm=result.grad_norm, trained_tokens=result.tokens,
        )  # fmt: skip
        self.history.append(record)
        if self.echo is not None:
            self.echo(line(record))
        if self.observe is not None:
            self.observe(record)
        return record


def line(r: StepRecord) -> str:
    return (
        f"step {r.step:3d}  v{r.version}  mean reward {r.mean_reward:.3f}  samples {r.samples}  "
        f"staleness {r.staleness}  token versions {r.token_versions[0]}-{r.token_versions[1]}  "
        f"evicted groups {r.evicted_groups}  loss {r.stats.loss:+.4f}  "
        f"clip {r.stats.clip_fraction:.2f}  entropy {r.entropy:.3f}  grad norm {r.grad_norm:.3f}  "
        f"swap {r.swap_s * 1000:.0f} ms  train {r.train_s:.2f}s  "
        f"publish {r.publish_s * 1000:.0f} ms"
    )


def _token_versions(batch: batches_mod.TrainBatch) -> tuple[int, int]:
    versions = [v for s in batch.samples for t in s.turns for v in t.output_versions]
    return (min(versions), max(versions)) if versions else (0, 0)


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0
