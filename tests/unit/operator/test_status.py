"""Status: conditions, reasons, phase, per-pool counts and the Events emitted on transitions."""

from __future__ import annotations

from typing import Any

import pytest

from treadle.api import v1alpha1
from treadle.operator import reasons, render, status
from treadle.operator.render import common as render_common

T0 = "2026-01-01T00:00:00Z"
T1 = "2026-01-01T00:01:00Z"
CAPACITY = {"H800": 16, "H20": 16}


def _all_ready(job: v1alpha1.RolloutJob) -> dict[str, status.DeploymentState]:
    return {
        name: status.DeploymentState(desired=n, ready=n, updated=n, current=True)
        for name, n in render.expected_replicas(job).items()
    }


def _cond(st: v1alpha1.RolloutJobStatus, type: str) -> v1alpha1.Condition:
    return next(c for c in st.conditions if c.type == type)


def _with_status(job: v1alpha1.RolloutJob, st: v1alpha1.RolloutJobStatus) -> v1alpha1.RolloutJob:
    return job.model_copy(update={"status": st})


def test_nothing_created_yet_is_progressing(math_job: v1alpha1.RolloutJob) -> None:
    st, transitions = status.compute(math_job, status.Observed(gpu_capacity=CAPACITY), now=T0)
    assert st.phase == "Progressing"
    assert _cond(st, "Ready").status == "False" and _cond(st, "Ready").reason == reasons.PODS_NOT_READY
    assert "pool decode not created yet" in _cond(st, "Ready").message
    assert st.pools_ready == "0/1" and st.observed_generation == 1
    assert {t.type for t in transitions} == {"Ready", "Progressing", "Degraded", "Suspended"}


def test_all_ready(math_job: v1alpha1.RolloutJob) -> None:
    observed = status.Observed(deployments=_all_ready(math_job), gpu_capacity=CAPACITY)
    st, _ = status.compute(math_job, observed, now=T0)
    assert st.phase == "Ready"
    assert _cond(st, "Ready").reason == reasons.ALL_RESOURCES_READY
    assert st.pools == [v1alpha1.PoolStatus(name="decode", accelerator="H20", desired=4, ready=4, gpus=8)]
    assert st.pools_ready == "1/1"


def test_transition_time_kept_until_status_flips_and_events_only_on_flips(
    math_job: v1alpha1.RolloutJob,
) -> None:
    observed = status.Observed(deployments=_all_ready(math_job), gpu_capacity=CAPACITY)
    first, _ = status.compute(math_job, observed, now=T0)
    again, transitions = status.compute(_with_status(math_job, first), observed, now=T1)
    assert transitions == []
    assert _cond(again, "Ready").last_transition_time == T0
    not_ready = dict(observed.deployments)
    name = "math-tool-pool-decode"
    not_ready[name] = status.DeploymentState(desired=4, ready=3, updated=4, current=True)
    later, transitions = status.compute(
        _with_status(math_job, again), status.Observed(deployments=not_ready, gpu_capacity=CAPACITY), now=T1
    )
    assert _cond(later, "Ready").last_transition_time == T1
    assert [(t.type, t.status, t.event_type) for t in transitions] == [
        ("Ready", "False", "Warning"),
        ("Progressing", "True", "Normal"),
    ]
    assert "pool decode 3/4 ready" in _cond(later, "Ready").message


def test_more_gpus_than_the_cluster_has_is_degraded_with_a_clear_reason(
    math_job: v1alpha1.RolloutJob,
) -> None:
    st, transitions = status.compute(math_job, status.Observed(gpu_capacity={"H20": 4, "H800": 16}), now=T0)
    degraded = _cond(st, "Degraded")
    assert st.phase == "Degraded"
    assert degraded.status == "True" and degraded.reason == reasons.INSUFFICIENT_GPU_CAPACITY
    assert degraded.message == (
        "pools decode ask 8 H20 GPUs (replicas x tensorParallelSize); the cluster has 4 allocatable H20 GPUs"
    )
    assert _cond(st, "Ready").reason == reasons.INSUFFICIENT_GPU_CAPACITY
    assert any(t.type == "Degraded" and t.event_type == "Warning" for t in transitions)


@pytest.mark.parametrize(
    ("pod", "reason"),
    [
        (
            {"status": {"containerStatuses": [{"name": "vllm", "image": "nope:1",
                                               "state": {"waiting": {"reason": "ErrImagePull"}}}]}},
            reasons.IMAGE_PULL_BACK_OFF,
        ),
        (
            {"status": {"containerStatuses": [{"name": "agent",
                                               "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]}},
            reasons.CRASH_LOOP_BACK_OFF,
        ),
        (
            {"status": {"conditions": [{"type": "PodScheduled", "status": "False",
                                        "message": "0/6 nodes: 2 Insufficient nvidia.com/gpu."}]}},
            reasons.INSUFFICIENT_GPU_CAPACITY,
        ),
        (
            {"status": {"conditions": [{"type": "PodScheduled", "status": "False",
                                        "message": "0/6 nodes: 6 Insufficient cpu."}]}},
            reasons.UNSCHEDULABLE,
        ),
    ],
    ids=["image-pull", "crash-loop", "gpu-unschedulable", "cpu-unschedulable"],
)  # fmt: skip
def test_pod_problems_are_classified(math_job: v1alpha1.RolloutJob, pod: dict[str, Any], reason: str) -> None:
    pod["metadata"] = {"labels": {render_common.COMPONENT_LABEL: "pool", render_common.POOL_LABEL: "decode"}}
    problem = status.pod_problem(pod)
    assert problem is not None and problem.reason == reason and problem.pool == "decode"
    observed = status.Observed(deployments=_all_ready(math_job), problems=[problem], gpu_capacity=CAPACITY)
    st, _ = status.compute(math_job, observed, now=T0)
    assert _cond(st, "Degraded").reason == reason
    assert _cond(st, "Degraded").message.startswith("pool decode: ")


def test_running_pod_has_no_problem() -> None:
    pod = {"status": {"phase": "Running", "containerStatuses": [{"state": {"running": {}}}]}}
    assert status.pod_problem(pod) is None


def test_suspended(math_job: v1alpha1.RolloutJob) -> None:
    job = math_job.model_copy(update={"spec": math_job.spec.model_copy(update={"suspend": True})})
    zero = {n: status.DeploymentState(0, 0, 0, True) for n in _all_ready(job)}
    # Capacity is irrelevant while suspended: nothing asks for GPUs.
    st, _ = status.compute(job, status.Observed(deployments=zero, gpu_capacity={}), now=T0)
    assert st.phase == "Suspended"
    assert _cond(st, "Suspended").status == "True"
    assert _cond(st, "Degraded").status == "False"
    assert st.pools[0].desired == 0 and st.pools[0].gpus == 0


def test_stale_deployment_generation_is_not_ready(math_job: v1alpha1.RolloutJob) -> None:
    deployments = _all_ready(math_job)
    deployments["math-tool-env"] = status.DeploymentState(desired=2, ready=2, updated=2, current=False)
    st, _ = status.compute(math_job, status.Observed(deployments=deployments, gpu_capacity=CAPACITY), now=T0)
    assert st.phase == "Progressing"


def test_policy_version_and_step_are_kept(math_job: v1alpha1.RolloutJob) -> None:
    job = _with_status(math_job, v1alpha1.RolloutJobStatus(policy_version=7, step=42))
    st, _ = status.compute(job, status.Observed(gpu_capacity=CAPACITY), now=T0)
    assert (st.policy_version, st.step) == (7, 42)


def test_readers_of_raw_objects() -> None:
    deployment = {"metadata": {"generation": 3}, "spec": {"replicas": 2},
                  "status": {"observedGeneration": 3, "readyReplicas": 1, "updatedReplicas": 2}}  # fmt: skip
    assert status.deployment_state(deployment) == status.DeploymentState(2, 1, 2, True)
    node = {"metadata": {"labels": {"treadle.dev/accelerator": "H800"}},
            "status": {"allocatable": {"nvidia.com/gpu": "8"}}}  # fmt: skip
    assert status.node_gpus(node, "treadle.dev/accelerator", "nvidia.com/gpu") == ("H800", 8)
    cordoned = node | {"spec": {"unschedulable": True}}
    assert status.node_gpus(cordoned, "treadle.dev/accelerator", "nvidia.com/gpu") is None


def test_hand_scaled_deployment_is_drift_and_not_ready(math_job: v1alpha1.RolloutJob) -> None:
    deployments = _all_ready(math_job)
    deployments["math-tool-env"] = status.DeploymentState(desired=0, ready=0, updated=0, current=True)
    observed = status.Observed(deployments=deployments, gpu_capacity=CAPACITY)
    assert status.drifted(math_job, observed) == ["math-tool-env"]
    st, _ = status.compute(math_job, observed, now=T0)
    assert st.phase == "Progressing"
    assert "env 0/2 ready" in _cond(st, "Ready").message
    assert status.drifted(math_job, status.Observed(deployments=_all_ready(math_job))) == []


def test_expected_replicas_match_the_rendered_deployments(math_job: v1alpha1.RolloutJob) -> None:
    from treadle.operator import config

    rendered = {
        c["metadata"]["name"]: c["spec"]["replicas"]
        for c in render.render_children(math_job, config.OperatorConfig())
        if c["kind"] == "Deployment"
    }
    assert render.expected_replicas(math_job) == rendered
