"""``status.trainer``: the trainer group's pods ready, finished and restarted, from the current Job's pods
(through the operator's kopf index), the ``TrainerRestarted`` Event, and ``treadle status``'s line."""

from __future__ import annotations

from typing import Any

import kopf
import pytest
import test_render_trainer as rt
from kopf._cogs.structs import ids
from kopf._core.actions import execution
from kopf._core.engines import indexing

from treadle.api import v1alpha1
from treadle.operator import config, explain, handlers, reasons, render, status
from treadle.operator.render import common as render_common
from treadle.operator.render import trainer as render_trainer

T0 = "2026-01-01T00:00:00Z"
T1 = "2026-01-01T00:01:00Z"
CFG = config.OperatorConfig()


def _pod(
    job: str, index: int, *, phase: str = "Running", ready: bool = True, restarts: int = 0, **meta: Any
) -> dict[str, Any]:
    labels = {
        render_common.JOB_LABEL: "math-tool",
        render_common.COMPONENT_LABEL: "trainer",
        render_trainer.JOB_NAME_LABEL: job,
        render_trainer.COMPLETION_INDEX: str(index),
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"{job}-{index}-abcde", "namespace": "team-a", "uid": f"{job}-{index}",
                     "labels": labels, **meta},
        "status": {
            "phase": phase,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            "containerStatuses": [{"name": "trainer", "restartCount": restarts}],
        },
    }  # fmt: skip


def _observed(
    job: v1alpha1.RolloutJob, *pods: dict[str, Any], trainer_job: str | None = None
) -> status.Observed:
    return status.Observed(
        deployments={
            name: status.DeploymentState(desired=n, ready=n, updated=n, current=True)
            for name, n in render.expected_replicas(job).items()
        },
        gpu_capacity={"H20": 16, "H800": 16},
        trainer_pods=[status.trainer_pod(p) for p in pods],
        trainer_job=render_trainer.job_name(job, CFG) if trainer_job is None else trainer_job,
    )


@pytest.fixture
def group() -> v1alpha1.RolloutJob:
    return rt.with_trainer(rt.GROUP)


def test_a_job_without_a_trainer_has_no_trainer_status(math_job: v1alpha1.RolloutJob) -> None:
    st, _ = status.compute(math_job, _observed(math_job), now=T0)
    assert st.trainer is None


def test_pods_ready_of_the_group(group: v1alpha1.RolloutJob) -> None:
    name = render_trainer.job_name(group, CFG)
    st, _ = status.compute(group, _observed(group, _pod(name, 0), _pod(name, 1, ready=False)), now=T0)
    assert st.trainer == v1alpha1.TrainerStatus(job=name, pods=2, ready=1, succeeded=0, restarts=0)
    assert st.phase == "Ready"  # the trainer runs to its end: its pods are no part of Ready


def test_only_the_current_jobs_pods_count(group: v1alpha1.RolloutJob) -> None:
    """A changed trainer is a new Job; the old one's pods, still being deleted, are not the group."""
    name = render_trainer.job_name(group, CFG)
    old = _pod("math-tool-trainer-0ld0ld00", 0, restarts=5, deletionTimestamp=T0)
    st, _ = status.compute(group, _observed(group, old, _pod(name, 0)), now=T0)
    assert st.trainer is not None and (st.trainer.ready, st.trainer.restarts) == (1, 0)


def test_restarts_count_container_restarts_and_failed_pods(group: v1alpha1.RolloutJob) -> None:
    name = render_trainer.job_name(group, CFG)
    pods = (
        _pod(name, 0, restarts=2),
        _pod(name, 1, restarts=1),
        _pod(name, 1, phase="Failed", ready=False),  # evicted: the Job replaced it
    )
    st, _ = status.compute(group, _observed(group, *pods), now=T0)
    assert st.trainer is not None and st.trainer.restarts == 4 and st.trainer.ready == 2


def test_finished_pods_and_a_suspended_group(group: v1alpha1.RolloutJob) -> None:
    name = render_trainer.job_name(group, CFG)
    done = [_pod(name, i, phase="Succeeded", ready=False) for i in (0, 1)]
    st, _ = status.compute(group, _observed(group, *done), now=T0)
    assert st.trainer is not None and (st.trainer.ready, st.trainer.succeeded) == (0, 2)
    suspended = rt.with_trainer(rt.GROUP, suspend=True)
    st, _ = status.compute(suspended, _observed(suspended), now=T0)
    assert st.trainer is not None and st.trainer.pods == 0


def test_a_restart_of_the_group_is_a_warning_event_once(group: v1alpha1.RolloutJob) -> None:
    name = render_trainer.job_name(group, CFG)
    first, _ = status.compute(group, _observed(group, _pod(name, 0), _pod(name, 1)), now=T0)
    restarted = _observed(group, _pod(name, 0, restarts=1), _pod(name, 1, restarts=1))
    second, transitions = status.compute(group.model_copy(update={"status": first}), restarted, now=T1)
    (event,) = [t for t in transitions if t.reason == reasons.TRAINER_RESTARTED]
    assert event.event_type == "Warning"
    assert event.event_message.startswith(f"trainer {name} restarted (2 restarts in all, 2 new)")
    _, again = status.compute(group.model_copy(update={"status": second}), restarted, now=T1)
    assert again == []


def test_no_restart_event_for_a_new_trainer_job(group: v1alpha1.RolloutJob) -> None:
    """The restarts of another Job (the trainer changed) are no restart of this one."""
    name = render_trainer.job_name(group, CFG)
    prev = v1alpha1.RolloutJobStatus(
        trainer=v1alpha1.TrainerStatus(job="math-tool-trainer-0ld0ld00", pods=2, ready=2, restarts=0)
    )
    _, transitions = status.compute(
        group.model_copy(update={"status": prev}), _observed(group, _pod(name, 0, restarts=3)), now=T0
    )
    assert reasons.TRAINER_RESTARTED not in {t.reason for t in transitions}


def test_condition_events_keep_their_message_form() -> None:
    t = status.Transition("Ready", "False", reasons.PODS_NOT_READY, "env 0/1 ready")
    assert t.event_message == "Ready=False: env 0/1 ready"
    assert status.Transition("Degraded", "False", reasons.AS_EXPECTED, "").event_message == "Degraded=False"


def test_the_operators_index_reads_each_trainer_pod_under_its_job(group: v1alpha1.RolloutJob) -> None:
    """Through kopf's own indexers, as its watch feeds them: a pod's newest version replaces its last."""
    name = render_trainer.job_name(group, CFG)
    handler = ids.HandlerId("trainer_pods")
    indexers = indexing.OperatorIndexers()
    indexers[handler] = indexing.OperatorIndexer()
    for pod in (_pod(name, 0, ready=False), _pod(name, 0, restarts=1), _pod(name, 1)):
        body = kopf.Body(pod)
        meta = pod["metadata"]
        found = handlers.trainer_pods(namespace=meta["namespace"], labels=meta["labels"], body=body)
        indexers.replace(body, {handler: execution.Outcome(final=True, result=found)})
    pods = list(indexers.indices[handler].get(("team-a", "math-tool"), ()))
    assert sorted((p.job, p.ready, p.restarts) for p in pods) == [(name, True, 0), (name, True, 1)]


def test_treadle_status_prints_the_trainer() -> None:
    raw = rt.with_trainer(rt.GROUP).model_dump(mode="json", by_alias=True)
    raw["status"] = {
        "trainer": {"job": "math-tool-trainer-0123abcd", "pods": 2, "ready": 1, "succeeded": 0, "restarts": 2}
    }
    report = explain.explain(explain.Snapshot(raw))
    assert report.trainer is not None and report.trainer.restarts == 2
    text = explain.format_report(report)
    assert "Trainer math-tool-trainer-0123abcd: 1/2 pods ready, 0 finished, 2 restarts\n" in text
    raw["status"] = {}
    assert "Trainer" not in explain.format_report(explain.explain(explain.Snapshot(raw)))
