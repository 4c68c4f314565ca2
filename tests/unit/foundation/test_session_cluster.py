"""Each test session gets its own dev cluster, and clusters of dead sessions are removed."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from treadle.devcluster import kwok


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_session_cluster_is_named_for_this_process_and_removes_only_dead_sessions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dead, live = _dead_pid(), os.getppid()
    for name in (f"treadle-e2e-{dead}", f"treadle-e2e-{live}", "treadle-e2e", "other-1"):
        (tmp_path / "clusters" / name).mkdir(parents=True)
    removed: list[str] = []
    monkeypatch.setattr(kwok.DevCluster, "down", lambda self: removed.append(self.name))

    cluster = kwok.session_cluster("treadle-e2e", tmp_path)

    assert cluster.name == f"treadle-e2e-{os.getpid()}"
    assert cluster.workdir == tmp_path
    assert removed == [f"treadle-e2e-{dead}"]


def test_session_cluster_without_a_clusters_folder_removes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    removed: list[str] = []
    monkeypatch.setattr(kwok.DevCluster, "down", lambda self: removed.append(self.name))
    assert kwok.session_cluster("treadle-e2e", tmp_path).name.startswith("treadle-e2e-")
    assert removed == []
