"""The toy task trained in one process: sample with plain torch, score, GRPO step; no services.

Called by the unit test that proves the learning signal and by ``treadle train --in-process``. It is
the control experiment for the full loop (``treadle.trainer.loop``): same model, same task, same
loss, so a service run that does not learn points at the plumbing, not at the algorithm.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import torch

from treadle import errors
from treadle.trainer import grpo, policy, toy


@dataclasses.dataclass(frozen=True)
class Config:
    steps: int = 20
    groups: int = 4
    """Prompt groups per step (the toy task has one prompt, so groups are independent draws)."""
    group_size: int = 8
    max_new_tokens: int = 12
    temperature: float = 1.0
    lr: float = 3e-3
    seed: int = 0
    loss: grpo.LossConfig = dataclasses.field(default_factory=grpo.LossConfig)

    def __post_init__(self) -> None:
        for name in ("steps", "groups", "group_size", "max_new_tokens"):
            if getattr(self, name) < 1:
                raise errors.SpecError("must be >= 1", field=name, value=getattr(self, name))
        if not self.lr > 0:
            raise errors.SpecError("must be > 0", field="lr", value=self.lr)


@dataclasses.dataclass(frozen=True)
class Step:
    step: int
    mean_reward: float
    """Mean reward of the samples this step trained on (drawn before its update)."""
    stats: grpo.LossStats
    seconds: float


def run(pol: policy.Policy, config: Config, *, echo: Callable[[str], None] | None = None) -> list[Step]:
    """``config.steps`` GRPO steps on the toy task; returns one record per step."""
    torch.manual_seed(config.seed)
    generator = torch.Generator().manual_seed(config.seed)
    optimizer = torch.optim.Adam(pol.model.parameters(), lr=config.lr)
    prompt = pol.prompt_ids(toy.PROMPT)
    n = config.groups * config.group_size
    history: list[Step] = []
    for step in range(1, config.steps + 1):
        began = time.perf_counter()
        samples = policy.sample(pol, prompt, n=n, max_new_tokens=config.max_new_tokens,
                                temperature=config.temperature, generator=generator)  # fmt: skip
        rewards = [toy.reward(pol.decode(s.output_ids)) for s in samples]
        groups = [str(i // config.group_size) for i in range(n)]
        advantages = grpo.group_advantages(rewards, groups)
        pol.model.train()
        logprobs, mask, _ = policy.token_logprobs(
            pol, [(prompt, s.output_ids) for s in samples], temperature=config.temperature
        )
        behaviour = torch.zeros_like(logprobs)
        for i, s in enumerate(samples):
            behaviour[i, : len(s.logprobs)] = torch.tensor(s.logprobs)
        loss, stats = grpo.policy_loss(
            logprobs, behaviour, torch.tensor(advantages), mask, config=config.loss
        )
        optimizer.zero_grad()
        torch.autograd.backward(loss)
        optimizer.step()
        record = Step(step, sum(rewards) / n, stats, time.perf_counter() - began)
        history.append(record)
        if echo is not None:
            echo(f"step {step:3d}  mean reward {record.mean_reward:.3f}  loss {stats.loss:+.4f}  "
                 f"clip {stats.clip_fraction:.2f}  {record.seconds:.2f}s")  # fmt: skip
    return history
