"""``treadle status``'s pure half: hand-made API objects -> the blockers it names."""

from __future__ import annotations

import copy
from typing import Any

import operator_examples
import pytest
import yaml

from treadle.api import v1alpha1
from treadle.operator import config, explain, reasons, render

EXAMPLE = (
    operator_examples.ROOT / "manifests" / "examples" / "math-tool-h20.yaml"
)  # pool decode: 4 x TP 2 H20
CAPACITY = {"H800": 16, "H20": 16}
GPU_MESSAGE = (
    "0/12 nodes are available: 4 Insufficient nvidia.com/gpu, 8 node(s) didn't match Pod's node affinity."
)


def _job(**annotations: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    doc["metadata"] |= {"namespace": "team-a", "uid": "u1", "generation": 1, "annotations": annotations}
    return doc


def _deployments(job: dict[str, Any], *, ready: dict[str, int] | None = None) -> list[dict[str, Any]]:
    """The job's rendered Deployments with every replica ready unless ``ready`` says otherwise (by name)."""
    out = []
    for obj in render.render_children(v1alpha1.parse_job(job), config.OperatorConfig()):
        if obj["kind"] == "Deployment":
            obj = copy.deepcopy(obj)
            n = (ready or {}).get(obj["metadata"]["name"], obj["spec"]["replicas"])
            obj["status"] = {"readyReplicas": n, "updatedReplicas": n, "observedGeneration": 1}
            obj["metadata"]["generation"] = 1
            out.append(obj)
    return out


def _pod(name: str, component: str, pool: str | None = None, **status: Any) -> dict[str, Any]:
    labels = {"treadle.dev/job": "math-tool", "treadle.dev/component": component}
    if pool:
        labels["treadle.dev/pool"] = pool
    return {"metadata": {"name": name, "labels": labels}, "status": status}


def _unschedulable(name: str) -> dict[str, Any]:
    cond = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "stale"}
    return _pod(name, "pool", "decode", phase="Pending", conditions=[cond])


def _failed_scheduling(pod: str, message: str, at: str) -> dict[str, Any]:
    return {
        "reason": "FailedScheduling",
        "message": message,
        "lastTimestamp": at,
        "involvedObject": {"kind": "Pod", "name": pod},
    }


def test_healthy_job_has_no_blockers() -> None:
    job = _job()
    report = explain.explain(explain.Snapshot(job, _deployments(job), gpu_capacity=CAPACITY))
    assert report.blockers == []
    assert [(p.name, p.accelerator, p.ready, p.desired) for p in report.pools] == [("decode", "H20", 4, 4)]
    assert "Nothing blocks it." in explain.format_report(report)


def test_no_gpus_free_names_the_schedulers_reason_per_pool() -> None:
    job = _job()
    deployments = _deployments(job, ready={"math-tool-pool-decode": 2})
    pods = [_unschedulable("d-3"), _unschedulable("d-4")]
    events = [
        _failed_scheduling("d-3", GPU_MESSAGE, "2026-01-01T00:00:05Z"),
        _failed_scheduling(
            "d-3", "0/12 nodes are available: old", "2026-01-01T00:00:01Z"
        ),  # older: not shown
        _failed_scheduling("d-4", GPU_MESSAGE, "2026-01-01T00:00:06Z"),
    ]
    report = explain.explain(explain.Snapshot(job, deployments, pods, events, gpu_capacity=CAPACITY))
    # The cluster has 16 H20 GPUs in all (the job asks 8): the GPUs exist, others hold them.
    assert report.blockers == [
        explain.Blocker("pool decode", reasons.INSUFFICIENT_GPU_CAPACITY, GPU_MESSAGE, pods=2)
    ]
    assert report.pools[0].ready == 2
    text = explain.format_report(report)
    assert "pool decode (2 pods): InsufficientGPUCapacity: 0/12 nodes are available: 4 Insufficient" in text


def test_more_gpus_than_the_cluster_has_is_named_before_the_pods() -> None:
    job = _job()
    report = explain.explain(
        explain.Snapshot(job, _deployments(job, ready={"math-tool-pool-decode": 0}), gpu_capacity={"H20": 4})
    )
    assert [(b.where, b.reason) for b in report.blockers] == [
        ("cluster", reasons.INSUFFICIENT_GPU_CAPACITY),
        ("pool decode", reasons.PODS_NOT_READY),  # no pod said why yet: the count is all there is
    ]
    assert (
        "ask 8 H20 GPUs" in report.blockers[0].message and "has 4 allocatable" in report.blockers[0].message
    )


def test_reward_gateway_at_zero_with_work_waiting() -> None:
    job = _job(**{v1alpha1.REWARD_DEMAND_ANNOTATION: "12"})
    # The operator has not scaled the gateway up yet (0 replicas rendered from a stale demand).
    deployments = _deployments(job, ready={"math-tool-reward": 0})
    for d in deployments:
        if d["metadata"]["name"] == "math-tool-reward":
            d["spec"]["replicas"] = 0
    report = explain.explain(explain.Snapshot(job, deployments, gpu_capacity=CAPACITY))
    reward = [b for b in report.blockers if b.reason == explain.REWARD_GATEWAY_DOWN]
    assert reward == [
        explain.Blocker(
            "reward",
            explain.REWARD_GATEWAY_DOWN,
            "12 scoring requests waiting (treadle.dev/reward-demand) "
            "but the reward gateway has 0/0 replicas ready",
        )
    ]


def test_reward_gateway_unreachable_crash_looping_shows_its_last_message() -> None:
    job = _job(**{v1alpha1.REWARD_DEMAND_ANNOTATION: "3"})
    deployments = _deployments(job, ready={"math-tool-reward": 0})
    crashing = {
        "name": "reward",
        "restartCount": 7,
        "state": {"waiting": {"reason": "CrashLoopBackOff"}},
        "lastState": {
            "terminated": {
                "exitCode": 1,
                "reason": "Error",
                "message": "Traceback\nImportError: no module judge",
            }
        },
    }
    pods = [_pod("r-1", "reward", phase="Running", containerStatuses=[crashing])]
    report = explain.explain(explain.Snapshot(job, deployments, pods, gpu_capacity=CAPACITY))
    assert [(b.where, b.reason) for b in report.blockers] == [
        ("reward", reasons.CRASH_LOOP_BACK_OFF),
        ("reward", explain.REWARD_GATEWAY_DOWN),
    ]
    assert report.blockers[0].message == (
        "container reward restarted 7 times; exit code 1, Error, last message: ImportError: no module judge"
    )
    assert report.blockers[1].message.endswith("the reward gateway has 0/1 replicas ready")
    assert report.failures == {"Error": 7}


def test_reward_gateway_with_a_ready_replica_is_no_blocker() -> None:
    job = _job(**{v1alpha1.REWARD_DEMAND_ANNOTATION: "12"})
    deployments = _deployments(job)
    report = explain.explain(explain.Snapshot(job, deployments, gpu_capacity=CAPACITY))
    assert report.blockers == []


def test_feeder_dataset_problem() -> None:
    said = "spec.tasks[0].dataset.source.path: /data/math.parquet: no such file"
    job = _job(**{v1alpha1.FEEDER_PROBLEM_ANNOTATION: said})
    report = explain.explain(explain.Snapshot(job, _deployments(job), gpu_capacity=CAPACITY))
    assert report.blockers == [explain.Blocker("feeder", reasons.DATASET_UNUSABLE, said)]


def test_invalid_spec_is_the_only_blocker() -> None:
    job = _job()
    job["spec"]["pools"][0]["tensorParallelSize"] = 3
    report = explain.explain(explain.Snapshot(job, gpu_capacity=CAPACITY))
    assert [(b.where, b.reason) for b in report.blockers] == [("spec", reasons.INVALID_SPEC)]
    assert "spec.pools[0].tensorParallelSize" in report.blockers[0].message


@pytest.mark.parametrize("ready", [0, 1])
def test_suspended_job_is_blocked_by_nothing(ready: int) -> None:
    job = _job()
    job["spec"]["suspend"] = True
    report = explain.explain(explain.Snapshot(job, _deployments(job, ready={"math-tool-pool-decode": ready})))
    assert report.blockers == []


def test_conditions_are_printed_with_their_reasons() -> None:
    job = _job()
    job["status"] = {
        "phase": "Degraded",
        "step": 12,
        "policyVersion": 3,
        "conditions": [
            {"type": "Degraded", "status": "True", "reason": "CrashLoopBackOff", "message": "reward: boom",
             "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 1},
        ],
    }  # fmt: skip
    text = explain.format_report(explain.explain(explain.Snapshot(job, _deployments(job))))
    assert text.startswith("RolloutJob team-a/math-tool: Degraded\n  step 12, policy version 3\n")
    assert "  Degraded     True    CrashLoopBackOff: reward: boom" in text


def test_the_schedulers_rollout_counts_are_shown() -> None:
    job = _job()
    job["status"] = {
        "rollout": {
            "completed": 1200, "failed": 3, "aborted": 17, "pending": 8, "inFlight": 16,
            "trajectoriesPerMinute": 42.5, "maxStaleness": 1,
            "failures": [
                {"reason": "stale: initiated at", "count": 17}, {"reason": "environment: open", "count": 3},
            ],
        }
    }  # fmt: skip
    text = explain.format_report(
        explain.explain(explain.Snapshot(job, _deployments(job), gpu_capacity=CAPACITY))
    )
    assert "1200 completed, 3 failed, 17 aborted; 8 pending, 16 in flight; 42.5 trajectories/min" in text
    assert "max staleness 1" in text
    assert "failed or aborted: stale: initiated at 17, environment: open 3" in text
