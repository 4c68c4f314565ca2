"""JobReporter: when it exists, what it writes (reward demand, training progress), and that API
failures never escape.

The real API server path (RBAC of the scheduler's ServiceAccount, the operator scaling the
gateway) is covered by ``e2e/operator/test_operator.py::test_reward_demand_scales_the_gateway``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from treadle import errors
from treadle.api import v1alpha1
from treadle.operator import handlers
from treadle.services.scheduler import jobreport, protocol


class RecordingKube:
    """Stands in for ``kubeapi.Client`` where only ``annotate_job``, ``patch_status`` and ``close``
    are called."""

    def __init__(self, fail: int = 0) -> None:
        self.calls: list[tuple[str, str, dict[str, str]]] = []
        self.statuses: list[tuple[str, str, dict[str, Any]]] = []
        self.fail = fail
        self.closed = False

    def patch_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        if self.fail:
            self.fail -= 1
            raise kubernetes.client.ApiException(status=403, reason="Forbidden")
        self.statuses.append((namespace, name, dict(status)))

    def annotate_job(self, namespace: str, name: str, annotations: Mapping[str, str]) -> None:
        if self.fail:
            self.fail -= 1
            raise kubernetes.client.ApiException(status=403, reason="Forbidden")
        self.calls.append((namespace, name, dict(annotations)))

    def close(self) -> None:
        self.closed = True


def _reporter(kube: RecordingKube) -> jobreport.JobReporter:
    client: Any = kube
    return jobreport.JobReporter(client, namespace="team-a", job="math")


@pytest.mark.parametrize(
    "environ",
    [
        {},  # not started by the operator
        {"TREADLE_JOB": "math"},  # no namespace
        {"TREADLE_JOB": "math", "TREADLE_NAMESPACE": "team-a", "KUBECONFIG": "/nonexistent/kubeconfig"},
        # a pod without a mounted ServiceAccount token (automountServiceAccountToken: false)
        {"TREADLE_JOB": "math", "TREADLE_NAMESPACE": "team-a", "KUBERNETES_SERVICE_HOST": "10.0.0.1",
         "KUBERNETES_SERVICE_PORT": "443"},
    ],
    ids=["no-job", "no-namespace", "no-kubeconfig", "no-token"],
)  # fmt: skip
def test_no_reporter_outside_a_cluster(environ: dict[str, str]) -> None:
    assert jobreport.JobReporter.from_env(environ) is None


def test_reporter_from_a_kubeconfig(tmp_path: Path) -> None:
    config = tmp_path / "kubeconfig"
    config.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: k, cluster: {server: 'https://127.0.0.1:6443'}}]\n"
        "users: [{name: u, user: {token: t}}]\ncontexts: [{name: c, context: {cluster: k, user: u}}]\n"
    )
    environ = {"TREADLE_JOB": "math", "TREADLE_NAMESPACE": "team-a", "KUBECONFIG": str(config)}
    reporter = jobreport.JobReporter.from_env(environ)
    assert reporter is not None and (reporter.namespace, reporter.job) == ("team-a", "math")


async def test_patches_only_when_the_value_changes() -> None:
    kube = RecordingKube()
    reporter = _reporter(kube)
    for pending in (40, 40, 0, 0, 3):
        await reporter.report_demand(pending)
    assert [c[2][v1alpha1.REWARD_DEMAND_ANNOTATION] for c in kube.calls] == ["40", "0", "3"]
    assert {c[:2] for c in kube.calls} == {("team-a", "math")}
    assert reporter.patches == 3 and reporter.errors == 0
    await reporter.aclose()
    assert kube.closed


async def test_api_errors_are_counted_and_the_value_retried() -> None:
    kube = RecordingKube(fail=1)
    reporter = _reporter(kube)
    await reporter.report_demand(7)  # 403: logged and counted, not raised
    assert reporter.errors == 1 and kube.calls == []
    await reporter.report_demand(7)  # not recorded as written, so the same value is tried again
    assert [c[2][v1alpha1.REWARD_DEMAND_ANNOTATION] for c in kube.calls] == ["7"]


async def test_negative_demand_names_the_field() -> None:
    with pytest.raises(errors.SpecError) as info:
        await _reporter(RecordingKube()).report_demand(-1)
    assert info.value.field == "pending"


def _progress(version: int, step: int, reward: float | None) -> protocol.Progress:
    return protocol.Progress(version=version, step=step, mean_reward=reward)


async def test_progress_reaches_the_status_only_when_it_changes() -> None:
    kube = RecordingKube()
    reporter = _reporter(kube)
    await reporter.report_progress(_progress(0, 0, None))  # nothing committed yet: nothing written
    for version in (1, 1, 2):
        await reporter.report_progress(_progress(version, version, 0.25 * version))
    await reporter.report_progress(_progress(3, 3, None))  # a trainer that does not say its reward
    assert kube.statuses == [
        ("team-a", "math", {"policyVersion": 1, "step": 1, "meanReward": 0.25}),
        ("team-a", "math", {"policyVersion": 2, "step": 2, "meanReward": 0.5}),
        ("team-a", "math", {"policyVersion": 3, "step": 3}),
    ]
    assert kube.calls == [] and reporter.patches == 3


async def test_a_failed_progress_patch_is_retried() -> None:
    kube = RecordingKube(fail=1)
    reporter = _reporter(kube)
    await reporter.report_progress(_progress(4, 4, 0.5))
    assert reporter.errors == 1 and kube.statuses == []
    await reporter.report_progress(_progress(4, 4, 0.5))
    assert [s[2]["step"] for s in kube.statuses] == [4]


def test_the_operator_never_writes_the_trainers_status_fields() -> None:
    status = v1alpha1.RolloutJobStatus(policy_version=7, step=7, mean_reward=0.9, phase="Ready")
    patch = handlers._status_patch(status)
    assert patch["phase"] == "Ready"
    assert not {"policyVersion", "step", "meanReward"} & set(patch)


def _stats(completed: int, **kw: Any) -> protocol.Stats:
    base: dict[str, Any] = dict(
        version=3, suspended=False, submitted=completed + 10, pending=4, in_flight=6,
        completed=completed, failed=0, aborted=0, unsaved=0, turns=0, env_retries=0, failed_by_reason={},
        tasks=(), stage_seconds={}, preemptions=0, turns_by_agent={},
    )  # fmt: skip
    return protocol.Stats(**(base | kw))


async def test_the_rollout_is_written_at_most_every_interval_with_its_rate_and_top_reasons() -> None:
    kube = RecordingKube()
    reporter = _reporter(kube)
    reasons = {f"environment: r{i}": i for i in range(1, 8)} | {"stale: initiated at": 20}
    await reporter.report_rollout(_stats(100), max_staleness=1, now=1000.0)
    await reporter.report_rollout(_stats(110), max_staleness=1, now=1005.0)  # too soon: not written
    later = _stats(160, failed=7, aborted=20, failed_by_reason=reasons)
    await reporter.report_rollout(later, max_staleness=2, now=1000.0 + jobreport.ROLLOUT_INTERVAL_S * 2)
    first, second = (status["rollout"] for _, _, status in kube.statuses)
    assert first == {"completed": 100, "failed": 0, "aborted": 0, "pending": 4, "inFlight": 6,
                     "trajectoriesPerMinute": 0.0, "maxStaleness": 1, "failures": []}  # fmt: skip
    # 87 finished in 20 s: 261 a minute; the five most frequent reasons, most frequent first.
    assert second["trajectoriesPerMinute"] == 261.0 and second["maxStaleness"] == 2
    assert [f["reason"] for f in second["failures"]] == [
        "stale: initiated at", "environment: r7", "environment: r6", "environment: r5", "environment: r4",
    ]  # fmt: skip
    # What the scheduler writes is what the CRD's status takes.
    v1alpha1.RolloutJobStatus.model_validate({"rollout": second})
    status = handlers._status_patch(v1alpha1.RolloutJobStatus.model_validate({"rollout": second}))
    assert "rollout" not in status  # the operator's patch never overwrites it
