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


class Roofline:
    """``EngineCost`` from the roofline model for one (accelerator, model, TP) worker.

    The same arithmetic as ``costmodel.prefill_batch_time`` / ``decode_step_time`` with the
    per-worker constants folded once: the simulator asks for a step time on every engine event, so
    this is its hottest code. A unit test pins it to the cost model's functions.
    """

    __slots__ = (
        "_attn",
        "_bw",
        "_comm_fixed",
        "_comm_per_token",
        "_kv",
        "_params2",
        "_rate",
        "_weights",
        "acc",
        "shape",
        "tp",
    )

    def __init__(self, acc: costmodel.Accelerator, shape: costmodel.ModelShape, tp: int) -> None:
        self.acc, self.shape, self.tp = acc, shape, tp
        self._rate = tp * acc.tflops * 1e12 * acc.mfu
        self._bw = tp * acc.hbm_tbps * 1e12 * acc.mbu
        self._params2 = 2.0 * shape.params
        self._attn = 4.0 * shape.layers * shape.attn_dim
        self._weights = shape.weight_bytes
        self._kv = shape.kv_bytes_per_token
        if tp == 1:
            self._comm_fixed = self._comm_per_token = 0.0
        else:
            self._comm_fixed = 2 * shape.layers * costmodel.ALLREDUCE_LATENCY_S
            ring = 2.0 * (tp - 1) / tp * shape.hidden * shape.bytes_per_param / (acc.nvlink_gbps * 1e9)
            self._comm_per_token = 2 * shape.layers * ring

    def prefill_flops(self, new_tokens: int, cached_tokens: int) -> float:
        return self._params2 * new_tokens + self._attn * new_tokens * (cached_tokens + (new_tokens + 1) / 2)

    def prefill_batch(self, *, flops: float, kv_tokens: float, new_tokens: float) -> float:
        if new_tokens <= 0:
            return 0.0
        compute = flops / self._rate
        memory = (self._weights + self._kv * kv_tokens) / self._bw
        comm = self._comm_fixed + self._comm_per_token * new_tokens if self._comm_fixed else 0.0
        return (compute if compute > memory else memory) + comm + costmodel.STEP_OVERHEAD_S

    def decode_step(self, batch: int, context_tokens: float) -> float:
        if batch <= 0:
            return 0.0
        compute = (self._params2 * batch + self._attn * context_tokens) / self._rate
        memory = (self._weights + self._kv * context_tokens) / self._bw
        comm = self._comm_fixed + self._comm_per_token * batch if self._comm_fixed else 0.0
        return (compute if compute > memory else memory) + comm + costmodel.STEP_OVERHEAD_S


TRAIN_FLOPS_PER_PARAM_TOKEN = 8.0
"""Forward + backward (6) plus one forward for old-policy log-probs (2); GRPO without a critic."""
TRAIN_MFU = 0.067
"""Calibrated to RollArt Fig. 3: a Qwen3-8B step on 128 SWE trajectories takes 84.1 s on 32 H800.
With ~20k tokens per SWE trajectory (ours) and ``TRAIN_FIXED_S`` off the top that is
8·8.19e9·2.56e6 / (79.1·32·989.5e12) = 0.067 of peak: the measured step includes the reference
model, optimizer and data movement, which this one factor absorbs."""
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
