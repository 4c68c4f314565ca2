"""What both ARL-Tangram workloads share: the drawn actions and their records, the event loop, the
rollout that walks each trajectory's steps, the profiling probes and the result a run reports."""

from __future__ import annotations

import dataclasses
import functools
import heapq
import itertools
import math
import random
import statistics
from collections.abc import Callable, Sequence

from treadle import errors
from treadle.policy.tangram import model, profile

MAX_EVENTS = 5_000_000
"""Bound on the events of one run."""


@dataclasses.dataclass
class Record:
    traj: int
    kind: str
    """``tool`` or ``reward``."""
    submit: float
    start: float = math.nan
    """Granted (queue ends)."""
    overhead: float = 0.0
    end: float = math.nan


@dataclasses.dataclass(frozen=True)
class Result:
    system: str
    act_s: float
    """Mean ACT over actions."""
    act_per_traj_s: float
    """Mean over trajectories of the sum of their actions' ACTs (Fig. 8's metric)."""
    stage_s: dict[str, float]
    """Per trajectory, the mean ACT sum of each action kind (Fig. 7's stages)."""
    breakdown: dict[str, dict[str, float]]
    """Kind -> mean queue, exec and overhead seconds per action (Table 1)."""
    makespan_s: float
    busy_fraction: float
    """Mean over trajectories of (ACT sum / lifetime) (Fig. 3c: 47 %)."""
    decision_ms: float
    """Median wall time of one ``schedule.decide`` (nan for the baselines)."""
    decisions: int
    restores: int
    timeouts: int


@dataclasses.dataclass(frozen=True)
class Job:
    """One action of a trajectory as the workload drew it."""

    traj: int
    kind: str
    t_true: float
    """Tool: its duration; reward: its one-unit duration."""
    t_est: float
    """What the profile says ``T_ori`` is (reward runs)."""
    service: int = 0


class Loop:
    """The event heap of one run: ``(time, sequence)`` orders it (handlers are closures)."""

    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self.events = 0

    def at(self, t: float, fn: Callable[[], None]) -> None:
        heapq.heappush(self._heap, (t, next(self._seq), fn))

    def run(self) -> None:
        while self._heap:
            self.events += 1
            if self.events > MAX_EVENTS:
                raise errors.SpecError(f"more than {MAX_EVENTS} events", field="simulation.batch")
            self.now, _, fn = heapq.heappop(self._heap)
            fn()


class Rollout:
    """The trajectories' steps: generation delays and actions, in order."""

    def __init__(self, loop: Loop, plans: Sequence[Sequence[float | Job]]) -> None:
        self.loop, self.plans = loop, plans
        self.pos = [0] * len(plans)
        self.end = [math.nan] * len(plans)
        self.records: list[Record] = []
        self.submit: Callable[[Job, Record], None] = lambda job, rec: None
        self.on_end: Callable[[int], None] = lambda traj: None

    def start(self) -> None:
        for i in range(len(self.plans)):
            self.loop.at(0.0, functools.partial(self.step, i))

    def step(self, i: int) -> None:
        if self.pos[i] == len(self.plans[i]):
            self.end[i] = self.loop.now
            self.on_end(i)
            return
        item = self.plans[i][self.pos[i]]
        self.pos[i] += 1
        if isinstance(item, Job):
            rec = Record(i, item.kind, self.loop.now)
            self.records.append(rec)
            self.submit(item, rec)
        else:
            self.loop.at(self.loop.now + item, functools.partial(self.step, i))

    def done(self, job: Job, rec: Record) -> None:
        rec.end = self.loop.now
        self.step(job.traj)


def probe(serial: float, rng: random.Random, units: Sequence[int], max_units: int) -> model.Elasticity:
    """The profiled elasticity: ``profile.fit`` over noisy probe runs of the true Amdahl curve."""
    samples = [
        (m, (serial + (1 - serial) / m) * rng.lognormvariate(0, 0.05)) for m in units for _ in range(3)
    ]
    fitted = profile.fit(samples, max_units)
    if fitted is None:
        raise errors.SpecError("the probes show no elasticity", field="simulation.serial", value=serial)
    return fitted


def amdahl(t_one: float, serial: float, m: int) -> float:
    return t_one * (serial + (1 - serial) / m)


def result(
    system: str, rollout: Rollout, decisions: Sequence[float], *, restores: int, timeouts: int
) -> Result:
    recs = rollout.records
    n = len(rollout.plans)
    per_traj = [0.0] * n
    per_kind: dict[str, list[float]] = {}
    for r in recs:
        act = r.end - r.submit
        per_traj[r.traj] += act
        per_kind.setdefault(r.kind, [0.0] * n)[r.traj] += act
    lifetime = rollout.end
    breakdown = {}
    for kind in sorted({r.kind for r in recs}):
        rs = [r for r in recs if r.kind == kind]
        breakdown[kind] = {
            "queue_s": statistics.fmean(r.start - r.submit for r in rs),
            "exec_s": statistics.fmean(r.end - r.start - r.overhead for r in rs),
            "overhead_s": statistics.fmean(r.overhead for r in rs),
        }
    return Result(
        system=system,
        act_s=statistics.fmean(r.end - r.submit for r in recs),
        act_per_traj_s=statistics.fmean(per_traj),
        stage_s={k: statistics.fmean(v) for k, v in sorted(per_kind.items())},
        breakdown=breakdown,
        makespan_s=max(lifetime),
        busy_fraction=statistics.fmean(a / t for a, t in zip(per_traj, lifetime, strict=True) if t > 0),
        decision_ms=statistics.median(decisions) * 1e3 if decisions else math.nan,
        decisions=len(decisions),
        restores=restores,
        timeouts=timeouts,
    )
