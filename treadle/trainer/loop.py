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

import torch

from treadle import errors
from treadle.client import batches as batches_mod
from treadle.client import publisher as publisher_mod
from treadle.client import retrying
from treadle.trainer import checkpoint, grpo, policy


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
class Config:
    steps: int = 20
    batch_size: int = 32
    lr: float = 3e-3
    temperature: float = 1.0
    """The engines' sampling temperature (token logprobs are rescored under it)."""
    loss: grpo.LossConfig = dataclasses.field(default_factory=grpo.LossConfig)
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
        if not self.lr > 0:
            raise errors.SpecError("must be > 0", field="lr", value=self.lr)


@dataclasses.dataclass(frozen=True)
class StepRecord:
    step: int
    version: int
    """Committed version the batch was requested at (the engines served it while training ran)."""
    published: int
    """Version this step's weights were published as (swapped in before the next step)."""
    samples: int
    tokens: int
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


def sequences(
    batch: batches_mod.TrainBatch,
) -> tuple[list[tuple[list[int], list[int], list[float]]], list[int]]:
    """Every turn with output tokens as (prompt ids, output ids, behaviour logprobs), and its sample."""
    seqs: list[tuple[list[int], list[int], list[float]]] = []
    owner: list[int] = []
    for i, s in enumerate(batch.samples):
        for turn in s.turns:
            if not turn.output_token_ids:
                continue
            if len(turn.output_versions) != len(turn.output_token_ids):
                raise errors.SpecError(
                    f"trajectory {s.trajectory_id}: {len(turn.output_token_ids)} output tokens but "
                    f"{len(turn.output_versions)} token versions; every token's version must be recorded",
                    field="turns.output_versions",
                )
            if len(turn.output_logprobs) != len(turn.output_token_ids):
                raise errors.SpecError(
                    f"trajectory {s.trajectory_id}: {len(turn.output_token_ids)} output tokens but "
                    f"{len(turn.output_logprobs)} logprobs; GRPO needs the sampling logprobs",
                    field="turns.output_logprobs",
                )
            seqs.append(
                (list(turn.prompt_token_ids), list(turn.output_token_ids), list(turn.output_logprobs))
            )
            owner.append(i)
    return seqs, owner


def train_step(
    pol: policy.Policy, optimizer: torch.optim.Optimizer, batch: batches_mod.TrainBatch, config: Config
) -> grpo.LossStats:
    """One GRPO update on ``batch`` (blocking: run it on a thread from async code)."""
    advantages = grpo.group_advantages(batch.rewards, [s.group_id for s in batch.samples])
    seqs, owner = sequences(batch)
    if not seqs:
        raise errors.SpecError(f"batch {batch.batch_id} has no output tokens to train on", field="samples")
    pol.model.train()
    logprobs, mask = policy.token_logprobs(pol, [(p, o) for p, o, _ in seqs], temperature=config.temperature)
    behaviour = torch.zeros_like(logprobs)
    for row, (_, _, lps) in enumerate(seqs):
        behaviour[row, : len(lps)] = torch.tensor(lps, dtype=behaviour.dtype)
    adv = torch.tensor([advantages[i] for i in owner], dtype=logprobs.dtype)
    loss, stats = grpo.policy_loss(logprobs, behaviour, adv, mask, config=config.loss)
    optimizer.zero_grad()
    torch.autograd.backward(loss)
    optimizer.step()
    return stats


class Trainer:
    def __init__(
        self,
        pol: policy.Policy,
        *,
        batches: batches_mod.Batches,
        publisher: publisher_mod.Publisher,
        gate: Gate,
        swapper: Swapper,
        config: Config,
        echo: Callable[[str], None] | None = None,
        observe: Callable[[StepRecord], None] | None = None,
        optimizer_store: checkpoint.OptimizerStore | None = None,
    ) -> None:
        self.policy = pol
        self.batches = batches
        self.publisher = publisher
        self.gate = gate
        self.swapper = swapper
        self.config = config
        self.echo = echo
        self.observe = observe
        self.optimizer = torch.optim.Adam(pol.model.parameters(), lr=config.lr)
        self.optimizer_store = optimizer_store
        """Where each published version's optimizer state goes too (None: nowhere)."""
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
            pending = await self._train(step, version, batch, swap_s, aborted, wait_s)
            waiting = time.perf_counter()
            if step >= self.config.steps:
                break
        await self.batches.ack()
        if pending is not None:
            await self._fence(pending)
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
        began = time.perf_counter()
        stats = await asyncio.to_thread(train_step, self.policy, self.optimizer, batch, self.config)
        trained = time.perf_counter()
        manifest = await self.publisher.publish(self.policy.model.state_dict())
        if self.optimizer_store is not None:  # before the version can be committed (at the next fence)
            await self.optimizer_store.save(manifest.version, self.optimizer)
        await retrying.wait_for(
            lambda: self.swapper.prefetch(manifest.version),
            what="placement (PrefetchWeights)",
            timeout_s=self.config.restart_wait_s,
        )
        record = StepRecord(
            step=step, version=version, published=manifest.version, samples=len(batch.samples),
            tokens=stats.tokens,
            mean_reward=_mean(batch.rewards), evicted_groups=batch.evicted_groups,
            staleness=max((version - s.init_version for s in batch.samples), default=0),
            token_versions=_token_versions(batch),
            swap_s=swap_s, train_s=trained - began, publish_s=time.perf_counter() - trained, stats=stats,
            aborted_on_commit=aborted, wait_s=wait_s, published_bytes=manifest.total_bytes,
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
        f"clip {r.stats.clip_fraction:.2f}  swap {r.swap_s * 1000:.0f} ms  train {r.train_s:.2f}s  "
        f"publish {r.publish_s * 1000:.0f} ms"
    )


def _token_versions(batch: batches_mod.TrainBatch) -> tuple[int, int]:
    versions = [v for s in batch.samples for t in s.turns for v in t.output_versions]
    return (min(versions), max(versions)) if versions else (0, 0)


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0
