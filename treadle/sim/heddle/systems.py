"""Heddle's systems (its three mechanisms and their alternatives) and a step's configuration and result.

Read by ``treadle.sim.heddle.step`` (one rollout step of one system) and the ``heddle`` scenario kind.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Literal

from treadle.policy import costmodel
from treadle.policy.heddle import baselines, predictor
from treadle.sim.heddle import workload

Placement = Literal["static", "cache-aware", "least-load", "heddle"]
Predictions = Literal["history", "noisy-oracle"]


@dataclasses.dataclass(frozen=True)
class System:
    """Scheduling x placement x resources (Heddle's three mechanisms and their alternatives)."""

    name: str
    scheduling: baselines.Scheduling
    placement: Placement
    preemption: bool = False
    migration: bool = False
    tp: int | Literal["adaptive"] = "adaptive"
    """A fixed TP degree for every worker, or Heddle's planner; ``0`` means the model's baseline."""
    least_load_abs: float = 4.0
    """``baselines.least_load`` imbalance threshold (requests) for ``least-load`` placement (ours)."""


HEDDLE = System("heddle", "progressive", "heddle", preemption=True, migration=True, tp="adaptive")
SYSTEMS: Mapping[str, System] = {
    s.name: s
    for s in (
        System("verl", "round-robin", "static", tp=0),
        HEDDLE,
        # scheduling ablation: Heddle's placement and resources, another queue order
        dataclasses.replace(HEDDLE, name="sched-fcfs", scheduling="fcfs", preemption=False),
        dataclasses.replace(HEDDLE, name="sched-round-robin", scheduling="round-robin", preemption=False),
        dataclasses.replace(HEDDLE, name="sched-autellix", scheduling="autellix", preemption=False),
        # placement ablation: Heddle's scheduling and resources, another placement
        dataclasses.replace(HEDDLE, name="place-least-load", placement="least-load", migration=False),
        dataclasses.replace(HEDDLE, name="place-cache-aware", placement="cache-aware", migration=False),
        # resource ablation: fixed TP everywhere
        dataclasses.replace(HEDDLE, name="fix-1", tp=1),
        dataclasses.replace(HEDDLE, name="fix-8", tp=8),
        # the configurations of bench/heddle_live.py, TP 1 as its engines: FIFO with least-loaded
        # placement (its sticky-least-loaded baseline), Heddle's ranking alone, with preemption, and
        # with Heddle's placement and migration (the DP: the live fallback is not simulated)
        System("live-fifo", "fcfs", "least-load", tp=1),
        dataclasses.replace(
            HEDDLE, name="live-priority", placement="least-load", preemption=False, migration=False, tp=1
        ),
        dataclasses.replace(HEDDLE, name="live-heddle-sched", placement="least-load", migration=False, tp=1),
        dataclasses.replace(HEDDLE, name="live-heddle", tp=1),
    )
}
LIVE_MIRROR = ("live-fifo", "live-priority", "live-heddle-sched", "live-heddle")
"""The systems of a scenario's ``live_mirror`` section (``bench/scenarios/heddle/live-mirror.yaml``)."""


@dataclasses.dataclass(frozen=True)
class StepConfig:
    domain: workload.Domain
    model: costmodel.ModelShape
    accelerator: costmodel.Accelerator = costmodel.H800
    gpus: int = 8
    baseline_tp: int = 1
    """The paper's homogeneous TP: 1 for 8B/14B, 2 for 32B."""
    per_worker: int = 100
    """Trajectories per baseline worker (the paper's batch of 100 per rollout worker)."""
    group_size: int = 16
    max_seqs: int = 100
    seed: int = 0
    predictions: Predictions = "history"
    oracle_sigma: tuple[float, ...] = (0.8, 0.5, 0.35, 0.25)
    """``noisy-oracle``: log-normal error of the prediction after 0, 1, 2, 3+ steps (ours; it stands
    in for the paper's Qwen3-0.6B regressor, whose Fig. 13 numbers were lost)."""
    merge_block: int = 4
    """Short-trajectory merging: block size of trajectories below the median prediction (ours)."""
    degrees: tuple[int, ...] = (1, 2, 4, 8)
    interference: Literal["closed-form", "simulated"] = "simulated"
    """How ``I(s)`` is profiled. ``simulated`` is the paper's method (``interference_by_simulation``:
    a group's members are drawn from the whole batch's shape), our default. On a long tail those
    members are tiny next to the head, so ``I`` stays near 1; without ``max_group_share`` the DP
    then crowds hundreds of trajectories onto one worker. ``closed-form``
    (``interference_from_step_times``) assumes every member is as long as the head, an upper bound
    that charges wide workers for running their group in waves and so steers the TP planner away
    from them."""
    plan_on: Literal["predictions", "previous-epoch"] = "previous-epoch"
    """What the TP planner sizes the pool for: the output lengths the same prompts produced one epoch
    earlier (our default), or this batch's dispatch predictions. The planner picks a pool shape for
    the batch's length *distribution*, and the paper runs it periodically, amortised over several
    steps, so it cannot hinge on one batch's per-trajectory guesses; those matter to the placement,
    which always uses the predictions. ``HistoryModel`` predicts a prompt's group mean at dispatch,
    which removes the within-group spread that makes the tail (on coding/Qwen3-14B its largest
    prediction is 12.4K tokens against an actual 41K), so planning on it sized the pool for a tail
    three times shorter than the one that sets the makespan."""
    max_group_share: float = 2.0
    """A worker's interference table stops at this multiple of its even share of the batch (ours):
    no worker is handed a group that runs in many KV-bound waves on the strength of noisy predictions."""

    @property
    def trajectories(self) -> int:
        workers = self.gpus // self.baseline_tp
        return (workers * self.per_worker // self.group_size) * self.group_size


@dataclasses.dataclass(frozen=True)
class StepResult:
    system: str
    label: str
    makespan_s: float
    output_tokens: int
    trajectories: int
    degrees: tuple[int, ...]
    preemptions: int
    migrations: int
    migration_fallbacks: int
    """Migrations whose transfer had not started when the tool returned (re-prefill instead)."""
    exposed_migration_s: float
    """Sum over migrations of the time the next step waited for the transfer."""
    prefill_tokens: int
    tail_queue_s: float
    """Summed step queueing delay (submit to first decode) of the trajectory that finished last."""
    accuracy: tuple[tuple[int, predictor.Accuracy], ...]
    """(steps done, predictor accuracy) for the predictions this run made."""
    plan_s: float
    """Wall seconds of the placement DP and the TP planner (control-plane cost)."""
    wall_s: float

    @property
    def throughput(self) -> float:
        """Generated tokens per second of rollout (Heddle's metric)."""
        return self.output_tokens / self.makespan_s if self.makespan_s > 0 else 0.0
