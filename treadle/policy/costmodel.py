"""Roofline cost model of LLM rollout on heterogeneous GPUs (RollArt Table 2), plus weight transfer.

Called by ``treadle.policy.affinity`` (``auto`` routing compares a task's cost on each accelerator
class) and by the simulator (``treadle.sim.cost``), which asks for every prefill batch and every
decode step it simulates. Pure arithmetic: seconds out, no clock, no randomness.

Model (RollArt digest §5.1; Heddle digest §5.1c; DARTS Eq. 4 uses the same per-step latency idea)::

    prefill(n new tokens, c cached)  = max(F_pf / (g·FLOPS·MFU), B_pf / (g·BW·MBU)) + comm(g, n) + t0
    decode_step(b seqs, C ctx total) = max(F_dec / (g·FLOPS·MFU), B_dec / (g·BW·MBU)) + comm(g, b) + t0
    F_pf  = 2·P·n + 4·L·Hq·d·n·(c + (n+1)/2)      dense matmuls + causal attention
    F_dec = 2·P·b + 4·L·Hq·d·C                     one token per sequence
    B_pf  = W + kv·(c + n)                          weights read once, KV written/read
    B_dec = W + kv·C                                weights once per step, every sequence's KV
    comm(g, t) = 2·L·(lat + 2·(g-1)/g · t·hidden·2 B / NVLink)   two all-reduces per layer (TP > 1)

P parameters, W weight bytes, L layers, Hq query heads of size d, kv KV bytes per token, g TP degree.

Calibration (RollArt §3, Fig. 4: Qwen3-8B, 6×H20 vs 2×H800, cost-equivalent, TP 1):

* Prefill. The ideal compute ratio is 3·148/989.5 = 0.449; the paper measures "as low as 0.53×".
  With MFU_H20 = 0.60 (ours) we set MFU_H800 = 0.60·0.449/0.53 = 0.508, so a prefill-bound batch
  on 2×H800 takes exactly 0.53× the time of 6×H20 (the paper's figure is the best case over batch
  sizes, which a pure-prefill batch reaches). ``cost_equivalent_ratio("prefill", ...)`` checks it.
* Decode. With the same MBU (0.80, ours: vLLM decode kernels reach 70-85% of HBM peak) on both
  classes and a 1.5 ms step overhead (ours: scheduler + launch with CUDA graphs), the decode ratio
  H20/H800 at a 2k-token mean context goes from 0.76 (32 sequences in flight) to 0.49 (256): the
  paper's 0.49-0.79× "across varying batch sizes". Small batches are weight-read bound (each H20
  re-reads the weights), large ones KV-read bound (where H20's 3.6× bandwidth per cost wins).

KV migration (Heddle) is bytes over the cluster link plus a fixed cost (``kv_migration_time``).
Weight transfer interpolates RollArt Tables 3-4 (measured at 15.26 / 27.51 / 61.02 GiB): exact at
the paper's three model sizes, linear between them and beyond: see ``TRANSFERS``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Literal

from treadle import errors

GIB = 1024**3


@dataclasses.dataclass(frozen=True)
class Accelerator:
    """One accelerator class. Peak numbers are RollArt Table 2; efficiencies are calibrated (above)."""

    name: str
    tflops: float
    """Dense BF16 peak, TFLOP/s (Table 2)."""
    hbm_gb: float
    """HBM capacity, GB (Table 2)."""
    hbm_tbps: float
    """HBM bandwidth, TB/s (Table 2)."""
    nvlink_gbps: float
    """NVLink bandwidth, GB/s (Table 2); used for tensor-parallel all-reduce."""
    cost: float
    """Normalized cost per GPU, H20 = 1.00 (Table 2, citing [69])."""
    mfu: float
    """Fraction of peak FLOP/s reached by prefill and decode matmuls (calibrated to Fig. 4's 0.53×)."""
    mbu: float
    """Fraction of peak HBM bandwidth reached by decode (ours, 0.80; spans Fig. 4's 0.49-0.79×)."""


H800 = Accelerator(
    "H800", tflops=989.5, hbm_gb=80, hbm_tbps=3.35, nvlink_gbps=400, cost=2.85, mfu=0.508, mbu=0.80
)
H20 = Accelerator(
    "H20", tflops=148.0, hbm_gb=96, hbm_tbps=4.0, nvlink_gbps=900, cost=1.00, mfu=0.60, mbu=0.80
)
ACCELERATORS: Mapping[str, Accelerator] = {"H800": H800, "H20": H20}


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """A dense decoder. Shapes are the models' Hugging Face ``config.json``; sizes match Table 3."""

    name: str
    params: float
    layers: int
    hidden: int
    q_heads: int
    kv_heads: int
    head_dim: int
    bytes_per_param: int = 2
    """BF16 weights and KV cache."""

    @property
    def weight_bytes(self) -> float:
        return self.params * self.bytes_per_param

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V, every layer, every KV head (GQA), BF16."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.bytes_per_param

    @property
    def attn_dim(self) -> int:
        return self.q_heads * self.head_dim


# Parameter counts: Table 3 sizes (15.26 / 27.51 / 61.02 GiB) divided by 2 bytes.
QWEN3_8B = ModelShape("qwen3-8b", params=8.19e9, layers=36, hidden=4096, q_heads=32, kv_heads=8, head_dim=128)
QWEN3_14B = ModelShape(
    "qwen3-14b", params=14.77e9, layers=40, hidden=5120, q_heads=40, kv_heads=8, head_dim=128
)
QWEN3_32B = ModelShape(
    "qwen3-32b", params=32.76e9, layers=64, hidden=5120, q_heads=64, kv_heads=8, head_dim=128
)
QWEN25_7B = ModelShape(
    "qwen2.5-7b", params=7.62e9, layers=28, hidden=3584, q_heads=28, kv_heads=4, head_dim=128
)
# DARTS's smallest model (Table 4: Qwen2.5-3B on 8 H20); shapes from its config.json, tied embeddings.
QWEN25_3B = ModelShape(
    "qwen2.5-3b", params=3.09e9, layers=36, hidden=2048, q_heads=16, kv_heads=2, head_dim=128
)
MODELS: Mapping[str, ModelShape] = {m.name: m for m in (QWEN3_8B, QWEN3_14B, QWEN3_32B, QWEN25_7B, QWEN25_3B)}

STEP_OVERHEAD_S = 1.5e-3
"""Fixed cost of one engine step (scheduling, sampling, launch with CUDA graphs); ours."""
ALLREDUCE_LATENCY_S = 8e-6
"""Latency of one NVLink all-reduce at small sizes; ours (NCCL ring on one node)."""
GPU_MEMORY_UTILIZATION = 0.90
"""Share of HBM vLLM may use (vLLM's ``gpu_memory_utilization`` default)."""
ACTIVATION_RESERVE_GB = 2.0
"""HBM kept for activations and CUDA graphs outside the KV cache; ours."""


def accelerator(name: str) -> Accelerator:
    try:
        return ACCELERATORS[name]
    except KeyError:
        raise errors.SpecError(
            f"unknown accelerator {name!r}; known: {sorted(ACCELERATORS)}", field="accelerator"
        ) from None


def model(name: str) -> ModelShape:
    try:
        return MODELS[name]
    except KeyError:
        raise errors.SpecError(f"unknown model {name!r}; known: {sorted(MODELS)}", field="model") from None


def _check_tp(tp: int) -> None:
    if tp < 1:
        raise errors.SpecError("tensor-parallel degree must be >= 1", field="tp", value=tp)


def _comm_s(acc: Accelerator, shape: ModelShape, tp: int, tokens: float) -> float:
    if tp == 1:
        return 0.0
    ring = 2.0 * (tp - 1) / tp * tokens * shape.hidden * shape.bytes_per_param / (acc.nvlink_gbps * 1e9)
    return 2 * shape.layers * (ALLREDUCE_LATENCY_S + ring)


def _roofline_s(acc: Accelerator, tp: int, flops: float, nbytes: float) -> float:
    compute = flops / (tp * acc.tflops * 1e12 * acc.mfu)
    memory = nbytes / (tp * acc.hbm_tbps * 1e12 * acc.mbu)
    return max(compute, memory)


def prefill_flops(shape: ModelShape, *, new_tokens: float, cached_tokens: float = 0.0) -> float:
    """FLOPs to prefill ``new_tokens`` after ``cached_tokens`` already in the KV cache (causal)."""
    attn = 4.0 * shape.layers * shape.attn_dim * new_tokens * (cached_tokens + (new_tokens + 1) / 2)
    return 2.0 * shape.params * new_tokens + attn


def prefill_time(
    acc: Accelerator, shape: ModelShape, *, new_tokens: float, cached_tokens: float = 0.0, tp: int = 1
) -> float:
    """Seconds for one engine step that prefills ``new_tokens`` (one sequence or a packed batch)."""
    _check_tp(tp)
    if new_tokens <= 0:
        return 0.0
    flops = prefill_flops(shape, new_tokens=new_tokens, cached_tokens=cached_tokens)
    nbytes = shape.weight_bytes + shape.kv_bytes_per_token * (cached_tokens + new_tokens)
    return _roofline_s(acc, tp, flops, nbytes) + _comm_s(acc, shape, tp, new_tokens) + STEP_OVERHEAD_S


def prefill_batch_time(
    acc: Accelerator, shape: ModelShape, *, flops: float, kv_tokens: float, new_tokens: float, tp: int = 1
) -> float:
    """Seconds for one step prefilling several sequences whose ``prefill_flops`` sum to ``flops``.

    The simulator packs every waiting prefill of a worker into one step, as vLLM does: weights are
    read once, so the batch costs less than the sum of its sequences.
    """
    _check_tp(tp)
    if new_tokens <= 0:
        return 0.0
    nbytes = shape.weight_bytes + shape.kv_bytes_per_token * kv_tokens
    return _roofline_s(acc, tp, flops, nbytes) + _comm_s(acc, shape, tp, new_tokens) + STEP_OVERHEAD_S


def decode_step_time(
    acc: Accelerator, shape: ModelShape, *, batch: int, context_tokens: float, tp: int = 1
) -> float:
    """Seconds for one decode step of ``batch`` sequences holding ``context_tokens`` in total."""
    _check_tp(tp)
    if batch <= 0:
        return 0.0
    flops = 2.0 * shape.params * batch + 4.0 * shape.layers * shape.attn_dim * context_tokens
    nbytes = shape.weight_bytes + shape.kv_bytes_per_token * context_tokens
    return _roofline_s(acc, tp, flops, nbytes) + _comm_s(acc, shape, tp, batch) + STEP_OVERHEAD_S


def decode_step_line(
    acc: Accelerator, shape: ModelShape, *, context_tokens: float, max_batch: int, tp: int = 1
) -> tuple[float, float]:
    """(intercept, seconds per sequence): the line through ``decode_step_time`` at batch 1 and
    ``max_batch``, every sequence holding ``context_tokens``.

    For an engine that charges a step ``intercept + per_sequence · running`` (the simulated engine
    of ``bench/heddle_live.py``). It is exact while the step stays on one side of the roofline at
    both ends: memory bound, each sequence adds its KV read (long agentic contexts make that the
    GPU's batch interference); the fit says nothing about a knee in between.
    """
    if max_batch < 2:
        raise errors.SpecError("must be at least 2 to fit a line", field="max_batch", value=max_batch)
    if context_tokens < 0:
        raise errors.SpecError("must be >= 0", field="context_tokens", value=context_tokens)
    one = decode_step_time(acc, shape, batch=1, context_tokens=context_tokens, tp=tp)
    full = decode_step_time(acc, shape, batch=max_batch, context_tokens=context_tokens * max_batch, tp=tp)
    per_sequence = (full - one) / (max_batch - 1)
    return one - per_sequence, per_sequence


def kv_capacity_tokens(acc: Accelerator, shape: ModelShape, *, tp: int = 1) -> int:
    """KV-cache tokens one worker of ``tp`` GPUs can hold (0 when the weights do not fit)."""
    _check_tp(tp)
    free = tp * (acc.hbm_gb * 1e9 * GPU_MEMORY_UTILIZATION - ACTIVATION_RESERVE_GB * 1e9) - shape.weight_bytes
    return max(0, int(free // shape.kv_bytes_per_token))


def cost_equivalent_ratio(
    phase: Literal["prefill", "decode"],
    *,
    total_batch: int,
    context_tokens: float,
    shape: ModelShape = QWEN3_8B,
    new_tokens: int = 2048,
) -> float:
    """RollArt Fig. 4's comparison for one phase: time on 2×H800 over time on 6×H20 (TP 1).

    ``total_batch`` sequences are split evenly over the GPUs of each side. For ``prefill`` each
    sequence prefills ``new_tokens`` after ``context_tokens`` cached; for ``decode`` each decodes one
    token at ``context_tokens``. Below 1 the H800 side is faster. The paper reports 0.53 for the
    prefill-heavy task and 1/ratio in 0.49-0.79 (H20 over H800) for the decode-heavy one.
    """
    sides = ((H800, 2), (H20, 6))
    times = []
    for acc, gpus in sides:
        per_gpu = total_batch / gpus
        if phase == "prefill":
            flops = per_gpu * prefill_flops(shape, new_tokens=new_tokens, cached_tokens=context_tokens)
            t = prefill_batch_time(
                acc,
                shape,
                flops=flops,
                kv_tokens=per_gpu * (context_tokens + new_tokens),
                new_tokens=per_gpu * new_tokens,
            )
        else:
            b = max(1, math.ceil(per_gpu))
            t = decode_step_time(acc, shape, batch=b, context_tokens=b * context_tokens)
        times.append(t)
    return times[0] / times[1]


@dataclasses.dataclass(frozen=True)
class TaskProfile:
    """What ``auto`` affinity knows about a task domain: means measured over recent trajectories."""

    mean_turns: float
    prompt_tokens: float
    """Tokens of the first prompt (system + task)."""
    response_tokens: float
    """Generated tokens per turn."""
    observation_tokens: float = 0.0
    """Tokens the environment adds per turn after the first (tool output, board state)."""
    prefix_reuse: float = 0.0
    """Share of each turn's context served from the prefix cache. Default 0: Qwen3's chat template
    drops earlier turns' reasoning, so the re-rendered history diverges right after the first turn;
    set it higher for templates that keep the history byte-identical."""


REFERENCE_BATCH_PER_GPU = 32
"""Sequences in flight per GPU when ``trajectory_cost`` amortises decode steps; ours (RollArt's
ROLL default ``max_running_requests=128`` over TP 1-4 gives 32-128)."""


def trajectory_gpu_seconds(
    acc: Accelerator,
    shape: ModelShape,
    profile: TaskProfile,
    *,
    batch_per_gpu: int = REFERENCE_BATCH_PER_GPU,
) -> float:
    """GPU-seconds one trajectory of ``profile`` costs on ``acc``, amortised over a full batch.

    Prefill is compute (batched prefill is compute bound); each decode token is charged 1/b of a
    decode step at batch b and at the trajectory's mean context in that turn. Step overheads are
    shared by the batch and left out, so the figure compares work, not latency.
    """
    turns = max(1, round(profile.mean_turns))
    rate = acc.tflops * 1e12 * acc.mfu
    bw = acc.hbm_tbps * 1e12 * acc.mbu
    total = 0.0
    context = 0.0
    for turn in range(turns):
        added = profile.prompt_tokens if turn == 0 else profile.observation_tokens
        cached = context * profile.prefix_reuse
        new = context - cached + added
        total += prefill_flops(shape, new_tokens=new, cached_tokens=cached) / rate
        context += added
        mean_ctx = context + profile.response_tokens / 2
        per_token = max(
            (2.0 * shape.params + 4.0 * shape.layers * shape.attn_dim * mean_ctx) / rate,
            (shape.weight_bytes / batch_per_gpu + shape.kv_bytes_per_token * mean_ctx) / bw,
        )
        total += profile.response_tokens * per_token
        context += profile.response_tokens
    return total


def trajectory_cost(
    acc: Accelerator,
    shape: ModelShape,
    profile: TaskProfile,
    *,
    batch_per_gpu: int = REFERENCE_BATCH_PER_GPU,
) -> float:
    """``trajectory_gpu_seconds`` times the accelerator's normalized cost (H20-seconds)."""
    return acc.cost * trajectory_gpu_seconds(acc, shape, profile, batch_per_gpu=batch_per_gpu)


@dataclasses.dataclass(frozen=True)
class Measured:
    """Seconds measured at a few sizes (GiB); piecewise-linear between them, end segments beyond."""

    sizes_gib: tuple[float, ...]
    seconds: tuple[float, ...]

    def at(self, size_gib: float) -> float:
        xs, ys = self.sizes_gib, self.seconds
        i = 1
        while i < len(xs) - 1 and size_gib > xs[i]:
            i += 1
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        return max(0.0, y0 + (y1 - y0) * (size_gib - x0) / (x1 - x0))


_SIZES = (15.26, 27.51, 61.02)  # Qwen3-8B / 14B / 32B, RollArt Table 3 (GiB despite the "GB" header)
TRANSFERS: Mapping[str, Measured] = {
    # RollArt Table 4: asynchronous cross-cluster weight transfer.
    "push": Measured(_SIZES, (32.4, 67.8, 127.3)),  # trainer -> Mooncake store, cross-cluster Ethernet
    "pull": Measured(_SIZES, (6.2, 16.3, 29.7)),  # accumulated pull, store -> inference workers
    "exposed-pull": Measured(_SIZES, (1.4, 5.1, 9.6)),  # the part of the pull rollout does not hide
    "naive": Measured(_SIZES, (38.6, 84.1, 157.0)),  # push + pull, no overlap (the veRL-like baseline)
    # RollArt Table 3: Mooncake end-to-end transfer, training cluster -> inference cluster.
    "tcp": Measured(_SIZES, (6.911, 14.437, 29.649)),
    "rdma": Measured(_SIZES, (5.466, 5.817, 9.442)),
}


def transfer_time(path: str, size_gib: float) -> float:
    """Seconds to move ``size_gib`` of weights over ``path`` (one of ``TRANSFERS``)."""
    try:
        measured = TRANSFERS[path]
    except KeyError:
        raise errors.SpecError(
            f"unknown transfer path {path!r}; known: {sorted(TRANSFERS)}", field="path"
        ) from None
    return measured.at(size_gib)


KV_LINK_GBPS = 400.0
"""Inter-node link for KV migration: RollArt's 400 Gbps InfiniBand inside a GPU cluster (§7.1)."""
KV_LINK_EFFICIENCY = 0.5
"""Share of the link a KV transfer achieves (ours: block-by-block copies, not one stream)."""
KV_MIGRATION_FIXED_S = 0.1
"""Fixed cost of a migration (handshake, block table rebuild); ours, chosen so that the result falls in
Heddle's measured 0.12-0.35 s per trajectory (Table 1) for 8B-32B at typical agentic contexts."""


def kv_migration_time(shape: ModelShape, *, tokens: float, link_gbps: float = KV_LINK_GBPS) -> float:
    """Seconds to move one trajectory's KV cache of ``tokens`` to another worker (Heddle §4.2)."""
    if tokens <= 0:
        return 0.0
    rate = link_gbps / 8 * 1e9 * KV_LINK_EFFICIENCY
    return KV_MIGRATION_FIXED_S + shape.kv_bytes_per_token * tokens / rate


def weight_gib(shape: ModelShape) -> float:
    return shape.weight_bytes / GIB
