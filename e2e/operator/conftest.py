"""Fixtures: the chart installed on the shared dev cluster, the operator running as its ServiceAccount.

See ``op_harness`` for how the ServiceAccount identity is obtained (TokenRequest, so the chart's
RBAC is what authorizes every call the operator makes).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

import op_harness
import pytest
import yaml

from treadle.devcluster import kwok


@pytest.fixture(scope="module")
def kubectl(dev_cluster: kwok.DevCluster) -> op_harness.Kubectl:
    return op_harness.Kubectl(dev_cluster)


@pytest.fixture(scope="module")
def chart(dev_cluster: kwok.DevCluster, kubectl: op_harness.Kubectl) -> Iterator[str]:
    """``helm upgrade --install`` of charts/treadle, watching only this module's jobs namespace."""
    existing = kubectl("get", "crd", op_harness.CRD, "--ignore-not-found", "-o", "name").stdout.strip()
    if existing:
        # A CRD applied by hand earlier in the session: let Helm adopt it rather than refuse.
        kubectl("label", "crd", op_harness.CRD, "app.kubernetes.io/managed-by=Helm", "--overwrite")
        kubectl("annotate", "crd", op_harness.CRD, f"meta.helm.sh/release-name={op_harness.RELEASE}",
                f"meta.helm.sh/release-namespace={op_harness.SYSTEM_NS}", "--overwrite")  # fmt: skip
    kubectl("create", "namespace", op_harness.JOBS_NS)
    values = f"operator.watchNamespaces={{{op_harness.JOBS_NS}}}"
    op_harness.helm(
        dev_cluster, "upgrade", "--install", op_harness.RELEASE, str(op_harness.CHART),
        "--namespace", op_harness.SYSTEM_NS, "--create-namespace", "--wait=false", "--set", values,
        "--set", op_harness.NO_PVC,
    )  # fmt: skip
    try:
        # Poll rather than `kubectl wait`, which fails outright while the CRD has no conditions yet.
        query = '{.status.conditions[?(@.type=="Established")].status}'
        op_harness.wait_for(
            "the RolloutJob CRD to be Established",
            lambda: kubectl("get", "crd", op_harness.CRD, "-o", f"jsonpath={query}").stdout == "True",
            timeout=60,
        )
        yield op_harness.RELEASE
    finally:
        kubectl("delete", "namespace", op_harness.JOBS_NS, "--wait=true", "--timeout=120s", check=False)
        op_harness.helm(dev_cluster, "uninstall", op_harness.RELEASE, "--namespace", op_harness.SYSTEM_NS)
        # Waited for: the next module's chart installs into a namespace of the same name, which the
        # API server refuses while this one is still terminating.
        kubectl("delete", "namespace", op_harness.SYSTEM_NS, "--wait=true", "--timeout=120s", check=False)
        # resource-policy keep leaves the CRD on uninstall (by design); this test installed it.
        kubectl("delete", "crd", op_harness.CRD, "--ignore-not-found", check=False)


@pytest.fixture(scope="module")
def operator(
    chart: str,
    dev_cluster: kwok.DevCluster,
    kubectl: op_harness.Kubectl,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[op_harness.Operator]:
    tmp = tmp_path_factory.mktemp("operator")
    kubeconfig = tmp / "serviceaccount.kubeconfig"
    op_harness.token_kubeconfig(kubectl, kubeconfig)
    op = op_harness.Operator(dev_cluster, kubeconfig, tmp / "operator.log")
    op.start()
    try:
        yield op
    finally:
        op.stop()
        if os.environ.get("TREADLE_E2E_SHOW_OPERATOR_LOG") == "1":
            sys.stderr.write(op.log.read_text())


@pytest.fixture
def apply_job(kubectl: op_harness.Kubectl) -> Iterator[Callable[[dict[str, Any]], str]]:
    """Apply a RolloutJob document into the jobs namespace; delete it after the test."""
    names: list[str] = []

    def apply(doc: dict[str, Any]) -> str:
        kubectl("apply", "-n", op_harness.JOBS_NS, "-f", "-", stdin=yaml.safe_dump(doc))
        names.append(doc["metadata"]["name"])
        return str(doc["metadata"]["name"])

    yield apply
    for name in names:
        with contextlib.suppress(AssertionError):
            kubectl(
                "delete", "rolloutjob", name, "-n", op_harness.JOBS_NS, "--ignore-not-found", "--wait=true"
            )
    # The garbage collector removes the children after the job: wait, so their GPUs are free for the
    # next test (the cluster has 16 of each kind, and a test that starts short of them is flaky).
    for name in names:
        op_harness.wait_for(
            f"pods of {name} collected",
            lambda name=name: (
                not kubectl.json("pods", "-n", op_harness.JOBS_NS, "-l", f"treadle.dev/job={name}")["items"]
            ),
            timeout=120,
        )
