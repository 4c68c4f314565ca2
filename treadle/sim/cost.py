"""Cost models the simulator asks for durations: inference engine steps, training, reward, weights.

Called by ``treadle.sim.entities.Worker`` (engine steps) and ``treadle.sim.engine`` (training, reward,
weight sync). The GPU arithmetic is ``treadle.policy.costmodel`` (the same model ``auto`` affinity
uses); this module binds it to one worker's accelerator, model and TP degree, and adds the costs
that only the simulator needs (training step, reward call), each with its source.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Protocol

from treadle.policy import costmodel


class EngineCost(Protocol):
    """Durations of one inference server's engine steps, in seconds."""

    def prefill_flops(self, new_tokens: int, cached_tokens: int) -> float: ...

    def prefill_batch(self, *, flops: float, kv_tokens: float, new_tokens: float) -> float: ...

    def decode_step(self, batch: int, context_tokens: float) -> float: ...


@dataclasses.dataclass(frozen=True)
class Roofline:
    """``EngineCost`` from the roofline model for one (accelerator, model, TP) worker."""

    acc: costmodel.Accelerator
    shape: costmodel.ModelShape
    tp: int

    def prefill_flops(self, new_tokens: int, cached_tokens: int) -> float:
        return costmodel.prefill_flops(self.shape, new_tokens=new_tokens, cached_tokens=cached_tokens)

    def prefill_batch(self, *, flops: float, kv_tokens: float, new_tokens: float) -> float:
        return costmodel.prefill_batch_time(
            self.acc, self.shape, flops=flops, kv_tokens=kv_tokens, new_tokens=new_tokens, tp=self.tp
        )

    def decode_step(self, batch: int, context_tokens: float) -> float:
        return costmodel.decode_step_time(
            self.acc, self.shape, batch=batch, context_tokens=context_tokens, tp=self.tp
        )


TRAIN_FLOPS_PER_PARAM_TOKEN = 8.0
"""Forward + backward (6) plus one forward for old-policy log-probs (2); GRPO without a critic."""
TRAIN_MFU = 0.063
"""Calibrated to RollArt Fig. 3: a Qwen3-8B step on 128 SWE trajectories takes 84.1 s on 32 H800.
With our SWE-like workload's ~20k tokens per trajectory that is 8·8.19e9·2.56e6 / (84.1·32·989.5e12)
= 0.063 of peak: the measured step includes the reference model, optimizer and data movement."""
TRAIN_FIXED_S = 5.0
"""Per-step fixed cost (scheduling, checkpoint barrier, log-prob gather); ours."""


def train_time(shape: costmodel.ModelShape, *, tokens: float, gpus: int, acc: costmodel.Accelerator) -> float:
    """Seconds for one training step over ``tokens`` on ``gpus`` of ``acc``."""
    flops = TRAIN_FLOPS_PER_PARAM_TOKEN * shape.params * tokens
    return TRAIN_FIXED_S + flops / (max(1, gpus) * acc.tflops * 1e12 * TRAIN_MFU)


@dataclasses.dataclass(frozen=True)
class RewardCost:
    """Latency of scoring one trajectory (RollArt §3, §6.1, §7.5)."""

    judge: costmodel.ModelShape = costmodel.QWEN25_7B
    """RollArt's math judge is Qwen2.5-7B (§7.1)."""
    judge_acc: costmodel.Accelerator = costmodel.H800
    call_overhead_mean_s: float = 0.01
    """Serverless per-call I/O: mean 0.01 s, max 2.1 s (§7.5)."""
    call_overhead_max_s: float = 2.1
    cold_start_s: float = 5.0
    """Serverless cold start after ``keep_warm_s`` idle; the paper gives none (ours)."""
    keep_warm_s: float = 60.0
    """Idle time after which a serverless instance is reclaimed (ours)."""
    rule_s: float = 0.05
    """A rule or code check on CPU (ours; GEM's math grader times out at 1 s, ROLL)."""

    def compute_s(self, kind: str, tokens: int) -> float:
        """GPU (llm-judge: one prefill over the trajectory) or CPU time of one score."""
        if kind == "llm-judge":
            return costmodel.prefill_time(self.judge_acc, self.judge, new_tokens=tokens)
        return self.rule_s

    def overhead_s(self, rng: random.Random) -> float:
        """Serverless call overhead: exponential with the paper's mean, capped at its max."""
        return min(self.call_overhead_max_s, rng.expovariate(1.0 / self.call_overhead_mean_s))


def weight_sync_s(mode: str, shape: costmodel.ModelShape) -> tuple[float, float]:
    """(exposed seconds the inference pause lasts, seconds until pushed weights are loadable).

    ``mooncake``: RollArt's asynchronous path -- the push runs behind rollout (Table 4 push) and only
    the exposed pull stalls generation. ``nccl``: the baselines' synchronous broadcast over the
    cluster's InfiniBand, fully exposed (Table 3 RDMA). ``naive``: cross-cluster push then pull
    with no overlap (Table 4 "Naive").
    """
    gib = costmodel.weight_gib(shape)
    if mode == "mooncake":
        return costmodel.transfer_time("exposed-pull", gib), costmodel.transfer_time("push", gib)
    if mode == "naive":
        return costmodel.transfer_time("naive", gib), 0.0
    return costmodel.transfer_time("rdma", gib), 0.0
