"""``treadle cluster up`` / ``down`` on a cluster of its own: idempotent, and no process left behind."""

from __future__ import annotations

import contextlib
import json
import uuid
from pathlib import Path

from treadle.devcluster import kwok, nodes
from treadle.devcluster.nodeagent import net


def test_up_is_idempotent_and_down_leaves_no_process(tmp_path: Path) -> None:
    cluster = kwok.DevCluster(name="lifecycle", pools=nodes.scaled_pools(3), workdir=tmp_path / "kwok")
    try:
        cluster.up()
        pids = cluster.process_ids()
        assert len(pids) == 5  # etcd, kube-apiserver, controller-manager, scheduler, kwok-controller
        cluster.up()  # a second `up` reuses the running cluster
        assert cluster.process_ids() == pids
        assert cluster.nodes_by_pool() == {"h800": ["h800-0"], "h20": ["h20-0"], "cpu": ["cpu-0"]}
    finally:
        cluster.down()
    assert not cluster.cluster_dir.exists()
    assert [pid for pid in pids if kwok._alive(pid)] == []
    assert not cluster.is_up()


def test_down_with_a_process_node_leaves_no_process_namespace_or_bridge(tmp_path: Path) -> None:
    cluster = kwok.DevCluster(
        name="lifecycle-run", pools=nodes.scaled_pools(3), workdir=tmp_path / "kwok", run_nodes=1
    )
    marker = f"treadle-lifecycle-{uuid.uuid4().hex}"
    container = {"name": "main", "image": "ghcr.io/treadle-dev/treadle-services:0.1.0",
                 "command": ["python", "-c", "import time; time.sleep(600)", marker]}  # fmt: skip
    spec = {"nodeSelector": {"kubernetes.io/hostname": "treadle-run-0"}, "containers": [container]}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "sleeper"}, "spec": spec}
    try:
        cluster.up()
        agent = cluster.process_ids()[-1]
        assert cluster.nodes_by_pool()["process"] == ["treadle-run-0"]
        cluster.kubectl("create", "-f", "-", stdin=json.dumps(pod))
        cluster.kubectl("wait", "--for=condition=Ready", "pod/sleeper", "--timeout=30s", timeout=40)
        assert net.cluster_netns(cluster.name) and pids_with(marker)
    finally:
        cluster.down()
    assert not kwok._alive(agent)
    assert net.leftovers(cluster.name) == []
    assert pids_with(marker) == []
    assert not cluster.cluster_dir.exists()


def pids_with(marker: str) -> list[int]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            if marker.encode() in cmdline.read_bytes():
                found.append(int(cmdline.parent.name))
    return found
