"""RewardDemandReporter: when it exists, what it writes, and that API failures never escape.

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
from treadle.services.scheduler import demand


class RecordingKube:
    """Stands in for ``kubeapi.Client`` where only ``annotate_job`` and ``close`` are called."""

    def __init__(self, fail: int = 0) -> None:
        self.calls: list[tuple[str, str, dict[str, str]]] = []
        self.fail = fail
        self.closed = False

    def annotate_job(self, namespace: str, name: str, annotations: Mapping[str, str]) -> None:
        if self.fail:
            self.fail -= 1
            raise kubernetes.client.ApiException(status=403, reason="Forbidden")
        self.calls.append((namespace, name, dict(annotations)))

    def close(self) -> None:
        self.closed = True


def _reporter(kube: RecordingKube) -> demand.RewardDemandReporter:
    client: Any = kube
    return demand.RewardDemandReporter(client, namespace="team-a", job="math")


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
    assert demand.RewardDemandReporter.from_env(environ) is None


def test_reporter_from_a_kubeconfig(tmp_path: Path) -> None:
    config = tmp_path / "kubeconfig"
    config.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: k, cluster: {server: 'https://127.0.0.1:6443'}}]\n"
        "users: [{name: u, user: {token: t}}]\ncontexts: [{name: c, context: {cluster: k, user: u}}]\n"
    )
    environ = {"TREADLE_JOB": "math", "TREADLE_NAMESPACE": "team-a", "KUBECONFIG": str(config)}
    reporter = demand.RewardDemandReporter.from_env(environ)
    assert reporter is not None and (reporter.namespace, reporter.job) == ("team-a", "math")


async def test_patches_only_when_the_value_changes() -> None:
    kube = RecordingKube()
    reporter = _reporter(kube)
    for pending in (40, 40, 0, 0, 3):
        await reporter.report(pending)
    assert [c[2][v1alpha1.REWARD_DEMAND_ANNOTATION] for c in kube.calls] == ["40", "0", "3"]
    assert {c[:2] for c in kube.calls} == {("team-a", "math")}
    assert reporter.patches == 3 and reporter.errors == 0
    await reporter.aclose()
    assert kube.closed


async def test_api_errors_are_counted_and_the_value_retried() -> None:
    kube = RecordingKube(fail=1)
    reporter = _reporter(kube)
    await reporter.report(7)  # 403: logged and counted, not raised
    assert reporter.errors == 1 and kube.calls == []
    await reporter.report(7)  # not recorded as written, so the same value is tried again
    assert [c[2][v1alpha1.REWARD_DEMAND_ANNOTATION] for c in kube.calls] == ["7"]


async def test_negative_demand_names_the_field() -> None:
    with pytest.raises(errors.SpecError) as info:
        await _reporter(RecordingKube()).report(-1)
    assert info.value.field == "pending"
