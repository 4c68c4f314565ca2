"""The docs' command blocks, run as written (``treadle.testing.docblocks``): the local dev cluster of
the README, and the chart README's quickstart on a cluster of process nodes only (a CPU one and one
with SIMULATED H20 GPUs), where the chart's pods and the operator really run."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from treadle.devcluster import binaries, kwok
from treadle.testing import docblocks

ROOT = Path(__file__).resolve().parents[2]


def shell_env(**extra: str) -> dict[str, str]:
    """This session's environment, with the tools on PATH as the README's ``export PATH`` line puts them."""
    venv_bin = Path(sys.executable).parent
    return os.environ | {"PATH": f"{venv_bin}:{binaries.bin_dir()}:{os.environ['PATH']}"} | extra


def test_the_readme_local_cluster_commands_bring_up_and_tear_down_the_dev_cluster() -> None:
    b = docblocks.block(ROOT, "local-cluster")
    assert b.commands()[0] == "make cluster-up" and b.commands()[-1] == "make cluster-down"
    try:
        ran = docblocks.run(b, env=os.environ, cwd=ROOT, timeout_s=900)
    finally:
        subprocess.run(["make", "cluster-down"], cwd=ROOT, capture_output=True, timeout=300, check=False)
    listed = next(r.output for r in ran if r.command.startswith("kubectl get nodes"))
    assert {"H800", "H20", "treadle-run-0"} <= set(listed.split()), listed
    assert not kwok.DevCluster().is_up()


@pytest.fixture(scope="module")
def process_cluster() -> Iterator[kwok.DevCluster]:
    """No KWOK node: a pod that schedules runs (a chart pod on a KWOK node would never start)."""
    cluster = kwok.session_cluster(
        "treadle-docs", kwok.cache_dir() / "kwok-e2e", pools=(), run_nodes=1, run_gpu_nodes=1
    )
    cluster.up()
    try:
        yield cluster
    finally:
        cluster.down()


def test_the_chart_readme_quickstart_installs_and_reconciles_a_job(process_cluster: kwok.DevCluster) -> None:
    b = docblocks.block(ROOT, "chart-quickstart")
    env = shell_env(KUBECONFIG=str(process_cluster.kubeconfig))
    docblocks.run(b, env=env, cwd=ROOT, timeout_s=300)
    # The operator (the chart's pod on the process node) reconciles the job: its PHASE appears. As
    # written, the chart keeps Redis on a PVC, which the dev cluster (no volume provisioner) never
    # binds: the job then says so, Degraded for RedisUnavailable (the dev cluster's own README block
    # installs with redis.persistence.enabled=false, and its jobs train).
    deadline, phase = time.monotonic() + 240, ""
    while time.monotonic() < deadline and not phase:
        phase = process_cluster.kubectl(
            "get", "rj", "-n", "team-a", "math-tool", "-o", "jsonpath={.status.phase}"
        )
        time.sleep(2)
    assert phase in ("Pending", "Progressing", "Ready", "Degraded"), phase
    if phase == "Degraded":
        claim = process_cluster.kubectl(
            "get", "pvc", "-n", "treadle-system", "-o", "jsonpath={.items[*].status.phase}"
        )
        reason = process_cluster.kubectl(
            "get", "rj", "-n", "team-a", "math-tool",
            "-o", "jsonpath={.status.conditions[?(@.type=='Degraded')].reason}",
        )  # fmt: skip
        assert (claim, reason) == ("Pending", "RedisUnavailable"), (claim, reason)
    process_cluster.kubectl("delete", "namespace", "team-a", "--wait=true", "--timeout=120s")
