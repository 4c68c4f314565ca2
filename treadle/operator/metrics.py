"""The operator's Prometheus collectors, on a registry of their own (names from ``treadle.metrics``).

Built once per operator process by ``treadle.operator.handlers`` at startup (and by tests), and
served on ``--metrics-port``. Job-level gauges are replaced wholesale per job so a deleted job or
a flipped condition leaves no stale series behind.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import prometheus_client as prom

from treadle import metrics as names
from treadle.api import v1alpha1

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class OperatorMetrics:
    """Controller and per-job metrics."""

    def __init__(self, registry: prom.CollectorRegistry | None = None) -> None:
        self.registry = registry or prom.CollectorRegistry()
        r = self.registry
        self.reconcile_total = prom.Counter(
            names.OPERATOR_RECONCILE_TOTAL, "Reconciles of RolloutJobs by result.", ["result"], registry=r
        )
        self.reconcile_seconds = prom.Histogram(
            names.OPERATOR_RECONCILE_SECONDS, "Time to render, diff and apply one RolloutJob.",
            buckets=LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.inflight = prom.Gauge(names.OPERATOR_RECONCILE_INFLIGHT, "Reconciles running now.", registry=r)
        self.jobs_pending = prom.Gauge(
            names.OPERATOR_JOBS_PENDING, "Jobs whose latest generation is not reconciled yet.", registry=r
        )
        self.children_applied = prom.Counter(
            names.OPERATOR_CHILDREN_APPLIED_TOTAL,
            "Children applied or deleted.",
            ["kind", "action"],
            registry=r,
        )
        self.status_updates = prom.Counter(
            names.OPERATOR_STATUS_UPDATES_TOTAL, "RolloutJob status patches written.", registry=r
        )
        self.job_info = prom.Gauge(
            names.OPERATOR_JOB_INFO, "1 per RolloutJob, labelled by phase.",
            ["namespace", "name", "uid", "phase"], registry=r,
        )  # fmt: skip
        self.job_condition = prom.Gauge(
            names.OPERATOR_JOB_CONDITION, "1 if the condition is True, 0 otherwise.",
            ["namespace", "name", "condition", "reason"], registry=r,
        )  # fmt: skip
        self.pool_replicas = prom.Gauge(
            names.OPERATOR_POOL_REPLICAS, "Inference pool replicas by state (ready, desired).",
            ["namespace", "name", "pool", "accelerator", "state"], registry=r,
        )  # fmt: skip
        self._series: dict[tuple[str, str], list[tuple[prom.Gauge, tuple[str, ...]]]] = {}

    @contextmanager
    def reconciling(self) -> Iterator[None]:
        """Time one reconcile and count it in flight."""
        self.inflight.inc()
        try:
            with self.reconcile_seconds.time():
                yield
        finally:
            self.inflight.dec()

    def forget_job(self, namespace: str, name: str) -> None:
        for gauge, labels in self._series.pop((namespace, name), []):
            gauge.remove(*labels)

    def observe_job(self, namespace: str, name: str, uid: str, status: v1alpha1.RolloutJobStatus) -> None:
        """Replace every per-job series of one job with its current status."""
        self.forget_job(namespace, name)
        series: list[tuple[prom.Gauge, tuple[str, ...]]] = []

        def put(gauge: prom.Gauge, labels: tuple[str, ...], value: float) -> None:
            gauge.labels(*labels).set(value)
            series.append((gauge, labels))

        put(self.job_info, (namespace, name, uid, status.phase), 1)
        for cond in status.conditions:
            put(
                self.job_condition,
                (namespace, name, cond.type, cond.reason),
                1 if cond.status == "True" else 0,
            )
        for pool in status.pools:
            put(self.pool_replicas, (namespace, name, pool.name, pool.accelerator, "ready"), pool.ready)
            put(self.pool_replicas, (namespace, name, pool.name, pool.accelerator, "desired"), pool.desired)
        self._series[(namespace, name)] = series
