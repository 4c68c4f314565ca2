"""Opportunistic trajectory migration during tool calls (Heddle §5.3): decision, cost, transfers.

Called by the placement service whenever the scheduler publishes a new prediction for a
trajectory that has just entered a tool call, once per transfer epoch to launch migrations, and by
the simulator.

Decision (``decide``). The presorted placement fixed group sizes ``c_j`` for ``n`` trajectories
(``presorted_dp.Placement.capacities``). When predictions change, re-running the DP is avoided:
the capacities are scaled to the ``n_active`` trajectories still running, ``c'_j = c_j · n_active /
n`` (rounded by largest remainder so they sum to ``n_active``, our choice), the trajectory's rank
among the active ones by predicted remaining length is recomputed, and the worker whose cumulative
scaled interval holds that rank is its target. If the target differs from the current worker and
the trajectory is in a tool call, it migrates, unless the cost model says the exposed part of the
move exceeds ``max_exposed_s`` (``inf`` by default: the paper always migrates).

Cost (``MigrationCost``), the part the tool call cannot hide being
``exposed = max(0, t_predict + t_move - t_tool)``:

* ``kv-transfer``: the KV cache moves (GPUDirect RDMA in the paper; on vLLM a KV connector such as
  Mooncake/NIXL where the deployment has one): ``t_move = overhead + tokens · kv_bytes / bandwidth``.
* ``re-prefill``: what stock vLLM offers. The next request is re-routed and the destination
  rebuilds the prefix. We warm it during the tool call with a one-token request carrying the
  context, so ``t_move = overhead + tokens / prefill_tokens_per_s``; the source's copy ages out of
  its prefix cache.

Transfers (``schedule_epoch``, the paper's transmission scheduler): each epoch, pending migrations
sorted by predicted length (longest first) are launched when neither endpoint is busy, so every
worker takes part in at most one transfer at a time.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Sequence
from typing import Literal

from treadle.errors import SpecError

Mode = Literal["kv-transfer", "re-prefill"]


@dataclasses.dataclass(frozen=True)
class MigrationCost:
    mode: Mode = "re-prefill"
    overhead_s: float = 0.05
    """Fixed seconds per move: control messages, allocation, scheduling."""
    kv_bytes_per_token: float = 160 * 1024
    """Qwen3-14B: 40 layers × 8 KV heads × 128 × 2 (K, V) × 2 bytes."""
    bandwidth_bytes_per_s: float = 400e9 / 8
    """400 Gb/s InfiniBand, the paper's interconnect."""
    prefill_tokens_per_s: float = 20_000.0
    """Destination re-prefill rate (``re-prefill`` mode)."""

    def move_seconds(self, context_tokens: int) -> float:
        if self.mode == "kv-transfer":
            return self.overhead_s + context_tokens * self.kv_bytes_per_token / self.bandwidth_bytes_per_s
        return self.overhead_s + context_tokens / self.prefill_tokens_per_s

    def exposed_seconds(
        self, context_tokens: int, *, tool_seconds: float, predict_seconds: float = 0.0
    ) -> float:
        """What the move adds to the trajectory's critical path."""
        return max(0.0, predict_seconds + self.move_seconds(context_tokens) - tool_seconds)


@dataclasses.dataclass(frozen=True)
class Active:
    """A running trajectory as the migration decision sees it."""

    trajectory_id: str
    worker_id: str
    predicted_remaining: float
    context_tokens: int
    in_tool_call: bool = False
    expected_tool_seconds: float = 0.0


@dataclasses.dataclass(frozen=True)
class Migration:
    trajectory_id: str
    source: str
    target: str
    predicted_remaining: float
    move_seconds: float
    exposed_seconds: float


def scaled_capacities(capacities: Sequence[int], n_active: int) -> tuple[int, ...]:
    """``c_j · n_active / n`` by largest remainder (ties to the earlier worker); sums to ``n_active``."""
    total = sum(capacities)
    if any(c < 0 for c in capacities) or total == 0:
        raise SpecError("needs non-negative sizes with a positive sum", field="capacities", value=capacities)
    if n_active < 0:
        raise SpecError("must be >= 0", field="n_active", value=n_active)
    exact = [c * n_active / total for c in capacities]
    out = [math.floor(x) for x in exact]
    left = n_active - sum(out)
    for j in sorted(range(len(exact)), key=lambda j: (-(exact[j] - out[j]), j))[:left]:
        out[j] += 1
    return tuple(out)


def target_worker(rank: int, workers: Sequence[str], capacities: Sequence[int]) -> str:
    """The worker whose cumulative capacity interval ``[start, start + c_j)`` holds ``rank``."""
    start = 0
    for worker, cap in zip(workers, capacities, strict=True):
        if rank < start + cap:
            return worker
        start += cap
    raise SpecError(f"rank {rank} is beyond the capacities ({start})", field="rank", value=rank)


def decide(
    trajectory_id: str,
    active: Sequence[Active],
    *,
    workers: Sequence[str],
    capacities: Sequence[int],
    cost: MigrationCost,
    predict_seconds: float = 0.0,
    max_exposed_s: float = math.inf,
    stale_tokens: float = 0.0,
) -> Migration | None:
    """Whether ``trajectory_id`` should move now; ``None`` to stay.

    ``workers`` and ``capacities`` are the placement's groups in order (``Placement.groups``).

    ``stale_tokens`` (ours; 0: the paper's rule): how far ahead the other trajectories' predictions
    may be only because they were made up to a turn ago. The moving trajectory was just re-predicted,
    so its remaining length has just dropped by a turn while its peers' have not yet; among equally
    long trajectories it ranks last every time, and one by one they all slide out of the first
    worker's interval (measured live: the six longest all ended on one worker). A peer predicted at
    most ``stale_tokens`` longer is counted as possibly tied, and the trajectory stays if its worker's
    interval has a rank for each of the tied ones already on that worker.
    """
    by_id = {a.trajectory_id: a for a in active}
    if trajectory_id not in by_id:
        raise SpecError(f"{trajectory_id!r} is not active", field="trajectory_id", value=trajectory_id)
    me = by_id[trajectory_id]
    if not me.in_tool_call:
        return None
    if stale_tokens < 0:
        raise SpecError("must be >= 0", field="stale_tokens", value=stale_tokens)
    ordered = sorted(active, key=lambda a: (-a.predicted_remaining, a.trajectory_id))
    rank = next(i for i, a in enumerate(ordered) if a.trajectory_id == trajectory_id)
    scaled = scaled_capacities(capacities, len(active))
    target = target_worker(rank, workers, scaled)
    if target == me.worker_id:
        return None
    if stale_tokens > 0 and me.worker_id in workers:
        # The possible ties: at least as long, at most ``stale_tokens`` longer. They hold the ranks from
        # ``best`` on, in some order; it stays if its worker's interval has a rank for each of them
        # already there, so equally long trajectories still split the way the plan asks.
        mine = me.predicted_remaining
        best = sum(a.predicted_remaining > mine + stale_tokens for a in active)
        tied = [a for a in active if mine <= a.predicted_remaining <= mine + stale_tokens]
        j = list(workers).index(me.worker_id)
        start = sum(scaled[:j])
        room = max(0, min(start + scaled[j], best + len(tied)) - max(start, best))
        if sum(a.worker_id == me.worker_id for a in tied) <= room:
            return None
    exposed = cost.exposed_seconds(
        me.context_tokens, tool_seconds=me.expected_tool_seconds, predict_seconds=predict_seconds
    )
    if exposed > max_exposed_s:
        return None
    return Migration(
        trajectory_id=trajectory_id,
        source=me.worker_id,
        target=target,
        predicted_remaining=me.predicted_remaining,
        move_seconds=cost.move_seconds(me.context_tokens),
        exposed_seconds=exposed,
    )


def schedule_epoch(pending: Sequence[Migration], busy: Collection[str] = ()) -> tuple[Migration, ...] | None:
    """The migrations to launch this epoch (longest first, endpoint-exclusive); ``None`` if none can."""
    taken = set(busy)
    batch: list[Migration] = []
    for m in sorted(pending, key=lambda m: (-m.predicted_remaining, m.trajectory_id)):
        if m.source not in taken and m.target not in taken:
            batch.append(m)
            taken.update((m.source, m.target))
    return tuple(batch) or None


def run_to_completion(
    pending: Sequence[Migration], *, max_epochs: int | None = None
) -> list[tuple[Migration, ...]]:
    """Epoch by epoch, assuming each epoch's transfers finish before the next (tests, simulator)."""
    left = list(pending)
    cap = max_epochs if max_epochs is not None else len(left) + 1
    epochs: list[tuple[Migration, ...]] = []
    for _ in range(cap):
        batch = schedule_epoch(left)
        if batch is None:
            return epochs
        epochs.append(batch)
        launched = {m.trajectory_id for m in batch}
        left = [m for m in left if m.trajectory_id not in launched]
    raise RuntimeError(f"migrations did not drain in {cap} epochs")
