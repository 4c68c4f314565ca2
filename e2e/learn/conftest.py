"""The dev cluster every module here runs its jobs on: created once for the folder (package scope),
so a module of further checks (``test_metrics``) costs no second cluster and chart install."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from treadle.devcluster import binaries, kwok
from treadle.operator.render import pool as render_pool
from treadle.trainer import policy

ROOT = Path(__file__).resolve().parents[2]
DEV = ROOT / "manifests" / "dev"
DATASETS = Path("/var/lib/treadle/datasets")
"""The host directory ``learn.yaml``'s feeder mounts (hostPath): process nodes' pods see the host."""
WEIGHTS = Path(render_pool.LOCAL_WEIGHTS_DIR)


@pytest.fixture(scope="package")
def cluster() -> Iterator[kwok.DevCluster]:
    """The dev cluster with the chart installed, the tiny model generated and the dataset in place."""
    job = yaml.safe_load((DEV / "learn.yaml").read_text())
    policy.ensure_model(Path(job["spec"]["agents"][0]["model"]), seed=0)
    # The node's local weight store outlives jobs: a trainer would continue an earlier run's versions.
    for old in WEIGHTS.glob("default/learn*"):
        shutil.rmtree(old)
    DATASETS.mkdir(parents=True, exist_ok=True)
    shutil.copy(DEV / "data" / "letters.jsonl", DATASETS / "letters.jsonl")
    c = kwok.session_cluster(
        "treadle-learn", kwok.cache_dir() / "kwok-e2e", pools=(), run_nodes=1, run_gpu_nodes=1
    )
    c.up()
    try:
        subprocess.run(
            [str(binaries.bin_dir() / "helm"), "install", "treadle", str(ROOT / "charts" / "treadle"),
             "--namespace", "treadle-system", "--create-namespace", "--wait", "--timeout", "90s",
             "--kubeconfig", str(c.kubeconfig)],
            check=True, capture_output=True, timeout=120,
        )  # fmt: skip
        c.kubectl("create", "configmap", "letters", f"--from-file={DEV / 'data' / 'letters.jsonl'}")
        yield c
    finally:
        c.down()
