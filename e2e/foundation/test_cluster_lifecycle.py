"""``treadle cluster up`` / ``down`` on a cluster of its own: idempotent, and no process left behind."""

from __future__ import annotations

from pathlib import Path

from treadle.devcluster import kwok, nodes


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
