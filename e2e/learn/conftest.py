"""The dev cluster every module here runs its jobs on, and the Prometheus that scrapes its pods:
created once for the folder (package scope), so a module of further checks (``test_reward_models``) costs
no second cluster and chart install. The cluster is made by the README's own commands
(``docblocks``), so the docs cannot drift from what works."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import dashcheck
import pytest
from devsetup import DATASETS, DEV, ROOT, SETUP, WEIGHTS, tool_env

from treadle.devcluster import kwok
from treadle.testing import docblocks, prometheus_server


@pytest.fixture(scope="package")
def cluster() -> Iterator[kwok.DevCluster]:
    """The dev cluster as the README's "On the dev cluster" block makes it, run as written: ``treadle
    cluster up`` (cluster ``treadle``, context in ~/.kube/config), ``helm install``, the dataset and
    the tiny model in place. ``test_learn`` runs the rest of the block (apply, watch, logs)."""
    block = docblocks.block(ROOT, "dev-cluster-learn")
    assert block.commands()[SETUP] == "kubectl apply -f manifests/dev/learn.yaml", block.commands()
    # The node's local weight store outlives jobs (each job's versions under its uid): reclaim the disk.
    for old in WEIGHTS.glob("default/learn*"):
        shutil.rmtree(old)
    kubeconfig = Path.home() / ".kube" / "config"
    c = kwok.DevCluster(name="treadle", user_kubeconfig=kubeconfig, pools=(), run_nodes=1, run_gpu_nodes=1)
    try:
        docblocks.run(block.part(0, SETUP), env=tool_env(), cwd=ROOT, timeout_s=900)
        assert DATASETS.joinpath("letters.jsonl").is_file()
        c.kubectl("create", "configmap", "letters", f"--from-file={DEV / 'data' / 'letters.jsonl'}")
        yield c
    finally:
        c.down()


@pytest.fixture(scope="package")
def prometheus(cluster: kwok.DevCluster) -> Iterator[prometheus_server.PrometheusServer]:
    """A real Prometheus scraping the cluster's pods through the chart's configuration (``dashcheck``)."""
    with dashcheck.prometheus(cluster) as prom:
        yield prom
