"""What a simulated run measured: the ``Result`` object and the observers that fill it.

Filled by ``treadle.sim.engine`` as events happen; read by ``treadle.sim.cli`` (tables, plots) and
``bench/`` (reports). Everything here is simulated, and says so in ``Result.label``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping


@dataclasses.dataclass(frozen=True)
class StepRecord:
    step: int
    started_at: float
    """When the trainer started waiting for this step's batch."""
    batch_at: float
    """When the batch was formed (the wait ended)."""
    train_at: float
    """When training started (after the exposed weight update)."""
    ended_at: float
    trajectories: int
    tokens: int

    @property
    def wait_s(self) -> float:
        return self.batch_at - self.started_at

    @property
    def update_s(self) -> float:
        return self.train_at - self.batch_at

    @property
    def train_s(self) -> float:
        return self.ended_at - self.train_at


@dataclasses.dataclass(frozen=True)
class PoolStats:
    name: str
    accelerator: str
    gpus: int
    workers: int
    busy_share: float
    """Mean share of the run a worker of this pool spent prefilling or decoding."""
    prefill_tokens: int
    decode_tokens: int


@dataclasses.dataclass
class Timeline:
    """In-flight trajectories over time, thinned to at most ``limit`` points."""

    limit: int = 2000
    times: list[float] = dataclasses.field(default_factory=list)
    values: list[int] = dataclasses.field(default_factory=list)
    _stride: float = 1.0

    def record(self, t: float, value: int) -> None:
        if self.times and t - self.times[-1] < self._stride:
            return
        self.times.append(t)
        self.values.append(value)
        if len(self.times) >= self.limit:
            self.times = self.times[::2]
            self.values = self.values[::2]
            self._stride *= 2


@dataclasses.dataclass(frozen=True)
class Result:
    """One simulated run."""

    scenario: str
    system: str
    steps: tuple[StepRecord, ...]
    pools: tuple[PoolStats, ...]
    total_s: float
    started: int
    completed: int
    trained: int
    aborted_stale: int
    aborted_redundant: int
    evicted: int
    trained_tokens: int
    mean_staleness: float
    """Mean over trained trajectories of (workers' version when the batch formed - version at start),
    RollArt's definition ("the current agent LLM is at version n")."""
    max_staleness: int
    lower_bound_s: float
    lower_bound_parts: Mapping[str, float]
    cost_h20_hours: float
    """GPU-hours times normalized cost (RollArt Table 2: H800 2.85, H20 1.00), all GPUs of the run."""
    reward_busy_share: float
    """Share of the run the dedicated reward GPUs spent scoring (0 with serverless reward)."""
    events: int
    wall_s: float
    timeline: Timeline
    label: str = "simulated"

    @property
    def step_time_s(self) -> float:
        """Steady-state step time: mean time between step ends after the first step (the paper
        averages five iterations); the whole run when there is one step."""
        if len(self.steps) < 2:
            return self.total_s
        return (self.steps[-1].ended_at - self.steps[0].ended_at) / (len(self.steps) - 1)

    @property
    def throughput_tps(self) -> float:
        """RollArt's metric: prompt + response tokens of a global batch over the step time."""
        if not self.steps:
            return 0.0
        tokens = sum(s.tokens for s in self.steps) / len(self.steps)
        return tokens / self.step_time_s if self.step_time_s > 0 else 0.0

    @property
    def lb_ratio(self) -> float:
        return self.total_s / self.lower_bound_s if self.lower_bound_s > 0 else float("inf")

    def split(self) -> dict[str, float]:
        """Mean seconds per step waiting for the batch, in the exposed weight update, training."""
        steps = self.steps[1:] or self.steps
        n = max(1, len(steps))
        return {
            "wait": sum(s.wait_s for s in steps) / n,
            "update": sum(s.update_s for s in steps) / n,
            "train": sum(s.train_s for s in steps) / n,
        }

    def summary(self) -> dict[str, object]:
        """Plain data for ``results.json``."""
        return {
            "label": self.label,
            "scenario": self.scenario,
            "system": self.system,
            "step_time_s": self.step_time_s,
            "throughput_tokens_per_s": self.throughput_tps,
            "total_s": self.total_s,
            "split_s": self.split(),
            "pools": [dataclasses.asdict(p) for p in self.pools],
            "started": self.started,
            "completed": self.completed,
            "trained": self.trained,
            "aborted_stale": self.aborted_stale,
            "aborted_redundant": self.aborted_redundant,
            "evicted": self.evicted,
            "mean_staleness": self.mean_staleness,
            "max_staleness": self.max_staleness,
            "lower_bound_s": self.lower_bound_s,
            "lower_bound_parts": dict(self.lower_bound_parts),
            "lb_ratio": self.lb_ratio,
            "cost_h20_hours": self.cost_h20_hours,
            "reward_busy_share": self.reward_busy_share,
            "events": self.events,
            "wall_s": self.wall_s,
        }
