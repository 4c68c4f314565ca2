"""One GRPO update over the trainer's ranks: the batch split by tokens, micro-batches, one optimizer step.

Called by ``treadle.trainer.group`` on every rank with the same batch. The split is
``treadle.policy.dataparallel``'s, computed by every rank from the batch alone, so the ranks agree
without talking. Each micro-batch's loss is its tokens' sum divided by the whole batch's output
tokens (``grpo.policy_loss``'s ``denominator``) and scaled by the number of ranks, because FSDP
averages gradients over the ranks: the summed gradients are then those of the token-level mean
over the whole batch, whatever the split (the numerics test compares 1 process against 2 ranks).

Gradients are reduce-scattered after every micro-batch rather than held unsharded until the last:
accumulating unsharded gradients would cost a whole model's gradients per rank, the memory FSDP is
there to save.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from treadle import errors
from treadle.client import batches as batches_mod
from treadle.policy import dataparallel
from treadle.trainer import grpo, parallel, policy


@dataclasses.dataclass(frozen=True)
class Settings:
    temperature: float = 1.0
    """The engines' sampling temperature (token logprobs are rescored under it)."""
    loss: grpo.LossConfig = dataclasses.field(default_factory=grpo.LossConfig)
    micro_batch_tokens: int | None = None
    """Most prompt + output tokens one rank puts through the model at once; None: all of its share."""
    max_grad_norm: float | None = None
    """Clip the gradients' global norm to this; None: measure it, clip nothing."""

    def __post_init__(self) -> None:
        if self.micro_batch_tokens is not None and self.micro_batch_tokens < 1:
            raise errors.SpecError("must be >= 1", field="micro_batch_tokens", value=self.micro_batch_tokens)
        if self.max_grad_norm is not None and not self.max_grad_norm > 0:
            raise errors.SpecError("must be > 0", field="max_grad_norm", value=self.max_grad_norm)


@dataclasses.dataclass(frozen=True)
class StepStats:
    loss: grpo.LossStats
    """Token-level means over the whole batch (every rank's tokens)."""
    entropy: float
    """Mean entropy of the policy at the batch's output tokens."""
    grad_norm: float
    """Global gradient norm before clipping."""
    tokens: int
    """Prompt and output tokens put through the model, over every rank."""
    micro_batches: int
    """Micro-batches each rank ran."""


Sequence = tuple[list[int], list[int], list[float]]


def sequences(batch: batches_mod.TrainBatch) -> tuple[list[Sequence], list[int]]:
    """Every turn with output tokens as (prompt ids, output ids, behaviour logprobs), and its sample."""
    seqs: list[Sequence] = []
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


def plan(costs: list[int], world_size: int, micro_batch_tokens: int | None) -> list[list[list[int]]]:
    """Per rank, its micro-batches as indices into ``costs``; every rank gets as many micro-batches."""
    shares = dataparallel.split_ranks(costs, world_size)
    micro = [
        [[share[p] for p in positions] for positions in dataparallel.split_micro([costs[i] for i in share],
                                                                                 micro_batch_tokens)]
        for share in shares
    ]  # fmt: skip
    count = max(1, max(len(m) for m in micro))
    return [dataparallel.pad_micro(m, count) for m in micro]


def train_step(
    pol: policy.Policy,
    optimizer: torch.optim.Optimizer,
    batch: batches_mod.TrainBatch,
    settings: Settings,
    world: parallel.World,
) -> StepStats:
    """One GRPO update on ``batch``; every rank calls it with the same batch (blocking)."""
    advantages = grpo.group_advantages(batch.rewards, [s.group_id for s in batch.samples])
    seqs, owner = sequences(batch)
    if not seqs:
        raise errors.SpecError(f"batch {batch.batch_id} has no output tokens to train on", field="samples")
    costs = [len(p) + len(o) for p, o, _ in seqs]
    output_tokens = sum(len(o) for _, o, _ in seqs)
    mine = plan(costs, world.size, settings.micro_batch_tokens)[world.rank]
    pol.model.train()
    optimizer.zero_grad()
    sums = [0.0] * 6  # loss, policy loss, kl, clip fraction, behaviour kl, entropy sum
    tokens = 0
    for indices in mine:
        # A rank with fewer micro-batches than another still runs the model (FSDP's collectives must
        # match): on one sequence, with every token's weight 0.
        weight = 1.0 if indices else 0.0
        chosen = indices or [0]
        scored = policy.token_logprobs(
            pol, [(seqs[i][0], seqs[i][1]) for i in chosen], temperature=settings.temperature
        )
        behaviour = torch.zeros_like(scored.logprobs)
        for row, i in enumerate(chosen):
            behaviour[row, : len(seqs[i][2])] = torch.tensor(seqs[i][2], dtype=behaviour.dtype)
        adv = torch.tensor([advantages[owner[i]] for i in chosen], dtype=scored.logprobs.dtype)
        mask = scored.mask * weight
        loss, stats = grpo.policy_loss(
            scored.logprobs, behaviour, adv.to(behaviour.device), mask,
            config=settings.loss, denominator=output_tokens,
        )  # fmt: skip
        (loss * world.size).backward()  # type: ignore[no-untyped-call]
        part = [stats.loss, stats.policy_loss, stats.kl, stats.clip_fraction, stats.behaviour_kl]
        sums = [a + b for a, b in zip(sums, [*part, float((scored.entropy * mask).sum())], strict=True)]
        tokens += sum(costs[i] for i in indices)
    grad_norm = clip_grad_norm(pol.model, settings.max_grad_norm)
    optimizer.step()
    optimizer.zero_grad()
    total = parallel.all_sum([*sums, float(tokens)], world)
    return StepStats(
        loss=grpo.LossStats(
            loss=total[0], policy_loss=total[1], kl=total[2], clip_fraction=total[3], behaviour_kl=total[4],
            tokens=output_tokens,
        ),
        entropy=total[5] / output_tokens,
        grad_norm=grad_norm,
        tokens=int(total[6]),
        micro_batches=len(mine),
    )  # fmt: skip


def clip_grad_norm(model: Any, max_norm: float | None) -> float:
    """The gradients' global norm over every rank's shards, clipped to ``max_norm`` when it is set."""
    norm = torch.nn.utils.clip_grad_norm_(
        [p for p in model.parameters() if p.grad is not None],
        max_norm=float("inf") if max_norm is None else max_norm,
    )
    full = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
    return float(full)
