"""The pod-problem index through kopf's own indexers, then the status computed from it.

Regression: a pool pod that was Unschedulable for a moment (GPUs still held by pods being
garbage-collected) kept the job ``Degraded=True / InsufficientGPUCapacity`` after it ran, because
the index function returned ``None`` for a healthy pod and kopf keeps an object's previous entries
for ``None``. The events are replayed through kopf's real ``OperatorIndexers``, as its watch does.
"""

from __future__ import annotations

from typing import Any

import kopf
from kopf._cogs.structs import ids
from kopf._core.actions import execution
from kopf._core.engines import indexing

from treadle.api import v1alpha1
from treadle.operator import handlers, reasons, render, status
from treadle.operator.render import common as render_common

T0 = "2026-01-01T00:00:00Z"
HANDLER = ids.HandlerId("child_pod_problems")
UNSCHEDULABLE = "0/6 nodes are available: 2 Insufficient nvidia.com/gpu."


def _pod(job: v1alpha1.RolloutJob, *, scheduled: bool) -> dict[str, Any]:
    labels = {
        render_common.JOB_LABEL: job.name,
        render_common.COMPONENT_LABEL: "pool",
        render_common.POOL_LABEL: "decode",
    }
    conditions = (
        [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}]
        if scheduled
        else [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": UNSCHEDULABLE}
        ]
    )
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p-0", "namespace": job.namespace, "uid": "pod-uid", "labels": labels},
        "status": {"phase": "Running" if scheduled else "Pending", "conditions": conditions},
    }


def _index(*events: dict[str, Any], result: Any = None) -> indexing.OperatorIndexers:
    """Feed pod versions to kopf's indexers the way its watch does (``index_resource``)."""
    indexers = indexing.OperatorIndexers()
    indexers[HANDLER] = indexing.OperatorIndexer()
    for pod in events:
        body = kopf.Body(pod)
        meta = pod["metadata"]
        found = handlers.child_pod_problems(namespace=meta["namespace"], labels=meta["labels"], body=body)
        indexers.replace(body, {HANDLER: execution.Outcome(final=True, result=found)})
    return indexers


def _problems(indexers: indexing.OperatorIndexers, job: v1alpha1.RolloutJob) -> list[status.PodProblem]:
    return list(indexers.indices[HANDLER].get((job.namespace, job.name), ()))


def _all_ready(job: v1alpha1.RolloutJob) -> dict[str, status.DeploymentState]:
    return {
        name: status.DeploymentState(desired=n, ready=n, updated=n, current=True)
        for name, n in render.expected_replicas(job).items()
    }


def test_unschedulable_pod_degrades_the_job(math_job: v1alpha1.RolloutJob) -> None:
    problems = _problems(_index(_pod(math_job, scheduled=False)), math_job)
    assert [p.reason for p in problems] == [reasons.INSUFFICIENT_GPU_CAPACITY]
    observed = status.Observed(deployments=_all_ready(math_job), problems=problems, gpu_capacity={"H20": 16})
    st, _ = status.compute(math_job, observed, now=T0)
    assert st.phase == "Degraded"


def test_pod_scheduled_after_a_shortage_clears_degraded(math_job: v1alpha1.RolloutJob) -> None:
    indexers = _index(_pod(math_job, scheduled=False), _pod(math_job, scheduled=True))
    problems = _problems(indexers, math_job)
    assert problems == []
    observed = status.Observed(deployments=_all_ready(math_job), problems=problems, gpu_capacity={"H20": 16})
    st, _ = status.compute(math_job, observed, now=T0)
    assert st.phase == "Ready"
    degraded = next(c for c in st.conditions if c.type == "Degraded")
    assert (degraded.status, degraded.reason) == ("False", reasons.AS_EXPECTED)


def test_kopf_keeps_an_entry_when_the_index_function_returns_none(math_job: v1alpha1.RolloutJob) -> None:
    """The kopf behaviour the fix relies on: ``None`` keeps the old entry, ``{}`` drops it."""
    indexers = _index(_pod(math_job, scheduled=False))
    healthy = kopf.Body(_pod(math_job, scheduled=True))
    indexers.replace(healthy, {HANDLER: execution.Outcome(final=True, result=None)})
    assert len(_problems(indexers, math_job)) == 1
    indexers.replace(healthy, {HANDLER: execution.Outcome(final=True, result=execution.Result({}))})
    assert _problems(indexers, math_job) == []
