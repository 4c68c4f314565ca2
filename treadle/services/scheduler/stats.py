"""The scheduler's counters: its Prometheus metrics and the totals ``SchedulerService.stats`` reports.

Written by every stage of the scheduler (turn loop, retries, reward, save); one ``Tally`` per
service, read by ``stats`` and by the gRPC edge.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
from collections.abc import Iterable

import prometheus_client as prom

from treadle import metrics
from treadle.services.scheduler import protocol
from treadle.v1 import common_pb2

STAGES = ("generation", "environment", "reward", "waiting")
ENV_CALLS = ("open", "step")
"""Environment calls the scheduler retries; the ``call`` label of the env-failure counter."""


class SchedulerMetrics:
    def __init__(self, registry_: prom.CollectorRegistry) -> None:
        self.stage = prom.Histogram(
            metrics.SCHED_STAGE_SECONDS, "Seconds per stage call", ["stage"], registry=registry_,
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
        )  # fmt: skip
        self.turns = prom.Counter(metrics.SCHED_TURNS_TOTAL, "Turns generated", ["task"], registry=registry_)
        self.trajectories = prom.Counter(
            metrics.SCHED_TRAJECTORIES_TOTAL,
            "Finished trajectories by status",
            ["task", "status"],
            registry=registry_,
        )
        self.inflight = prom.Gauge(metrics.SCHED_INFLIGHT, "Trajectories in flight", registry=registry_)
        self.pending = prom.Gauge(
            metrics.SCHED_PENDING, "Trajectories waiting for admission", registry=registry_
        )
        self.env_failures = prom.Counter(
            metrics.SCHED_ENV_FAILURES_TOTAL,
            "Failed environment calls, by call",
            ["call"],
            registry=registry_,
        )
        for call in ENV_CALLS:  # series exist at 0 before the first failure, so dashboards show a flat line
            self.env_failures.labels(call)
        self.env_servers = prom.Gauge(
            metrics.SCHED_ENV_SERVERS, "Environment servers new sessions are opened on", registry=registry_
        )
        self.reward_seconds = prom.Histogram(
            metrics.SCHED_REWARD_SECONDS, "Reward gateway latency", registry=registry_,
            buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30),
        )  # fmt: skip
        self.reward = prom.Summary(
            metrics.SCHED_TRAJECTORY_REWARD, "Rewards of completed trajectories, by task", ["task"],
            registry=registry_,
        )  # fmt: skip
        self.version = prom.Gauge(metrics.SCHED_POLICY_VERSION, "Policy version served", registry=registry_)
        self.prediction_error = prom.Histogram(
            metrics.SCHED_PREDICTION_ERROR_TOKENS,
            "|predicted - actual| remaining output tokens of a completed trajectory, per prediction, by the"
            " steps done when it was made (observed at the finish, when the actual is known)",
            ["steps_done"], registry=registry_,
            buckets=(16, 64, 256, 1024, 4096, 16384, 65536),
        )  # fmt: skip
        self.preemptions = prom.Counter(
            metrics.SCHED_PREEMPTIONS_TOTAL,
            "Running generations aborted and re-queued for a higher-ranked waiting turn",
            registry=registry_,
        )
        # Children resolved once per label values: labels() locks and hashes on every call, and these
        # run several times a turn. The label values are bounded (stages, configured tasks, statuses).
        self.stage_of = functools.cache(self.stage.labels)
        self.turns_of = functools.cache(self.turns.labels)
        self.trajectories_of = functools.cache(self.trajectories.labels)
        self.reward_of = functools.cache(self.reward.labels)
        self.prediction_error_of = functools.cache(self.prediction_error.labels)


@dataclasses.dataclass
class TaskCounts:
    submitted: int = 0
    completed: int = 0
    failed: int = 0
    aborted: int = 0
    reward_sum: float = 0.0


class Tally:
    """Totals since the start: per task, per stage, per agent and per failure reason."""

    def __init__(self, tasks: Iterable[str], metrics_: SchedulerMetrics) -> None:
        self.metrics = metrics_
        self.per_task = {name: TaskCounts() for name in tasks}
        self.turns = 0
        self.max_staleness = 0
        """Most versions a stored trajectory's oldest token lagged the committed version by."""
        self.turns_by_agent: collections.Counter[str] = collections.Counter()
        self.env_retries = 0
        self.preemptions = 0
        self.failed_by_reason: collections.Counter[str] = collections.Counter()
        self.stage_totals = dict.fromkeys(STAGES, 0.0)

    def turn(self, task: str, agent: str) -> None:
        self.turns += 1
        if agent:
            self.turns_by_agent[agent] += 1
        self.metrics.turns_of(task).inc()

    def record(self, traj: common_pb2.Trajectory, *, version: int = 0) -> None:
        """Count a trajectory the buffer stored (or that can never be stored) with ``version`` committed."""
        self.max_staleness = max(self.max_staleness, version - traj.min_version)
        counts = self.per_task[traj.task]
        setattr(counts, traj.status, getattr(counts, traj.status) + 1)
        if traj.status == "completed":
            counts.reward_sum += traj.reward
            self.metrics.reward_of(traj.task).observe(traj.reward)
        else:
            self.failed_by_reason[reason_kind(traj.reason)] += 1
        self.metrics.trajectories_of(traj.task, traj.status).inc()

    def stats(
        self, *, version: int, suspended: bool, pending: int, in_flight: int, unsaved: int, step: int = 0
    ) -> protocol.Stats:
        counts = self.per_task.values()
        return protocol.Stats(
            version=version, suspended=suspended, submitted=sum(c.submitted for c in counts), pending=pending,
            in_flight=in_flight, completed=sum(c.completed for c in counts),
            failed=sum(c.failed for c in counts), aborted=sum(c.aborted for c in counts), unsaved=unsaved,
            turns=self.turns, env_retries=self.env_retries, failed_by_reason=dict(self.failed_by_reason),
            tasks=tuple(
                protocol.TaskStats(
                    task=name, submitted=c.submitted, completed=c.completed, failed=c.failed,
                    aborted=c.aborted, mean_reward=c.reward_sum / c.completed if c.completed else 0.0,
                )
                for name, c in sorted(self.per_task.items())
            ),
            stage_seconds=dict(self.stage_totals), preemptions=self.preemptions,
            turns_by_agent=dict(self.turns_by_agent), step=step,
        )  # fmt: skip


def reason_kind(reason: str) -> str:
    """The stats key of a reason: ``"<stage>: <call>"`` without the detail (ids, URLs, versions vary)."""
    head = reason.split(": ", 2)
    return ": ".join(head[:2]) if len(head) > 1 else reason
