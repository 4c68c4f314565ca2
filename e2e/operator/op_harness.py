"""Harness for the operator e2e tests: chart install, the operator subprocess, kubectl, polling.

``helm upgrade --install`` puts the CRD, the ServiceAccount and its least-privilege RBAC on the
cluster; the operator then runs as a subprocess (``treadle operator run``) with a kubeconfig that
holds a token minted for that ServiceAccount (TokenRequest), so every call it makes is
authenticated as the ServiceAccount and authorized by the chart's RBAC, exactly as in a pod.
Everything lives in this module's own namespaces and is removed at the end; the shared
``dev_cluster`` stays up for other tests.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml

from treadle.devcluster import kwok

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "treadle"
SYSTEM_NS = "treadle-op-e2e-system"
JOBS_NS = "treadle-op-e2e"
RELEASE = "treadle-op-e2e"
SERVICE_ACCOUNT = f"{RELEASE}-treadle-operator"
CRD = "rolloutjobs.treadle.dev"
NO_PVC = "redis.persistence.enabled=false"
"""The dev cluster has no volume provisioner: the chart's Redis keeps its AOF on an emptyDir there."""
T = TypeVar("T")


def wait_for(what: str, probe: Callable[[], T | None], *, timeout: float = 90, interval: float = 0.5) -> T:
    """Poll ``probe`` until it returns a truthy value; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last: {last!r}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Operator:
    """The operator subprocess and how to reach it."""

    cluster: kwok.DevCluster
    kubeconfig: Path
    log: Path
    metrics_port: int = 0
    liveness_port: int = 0
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.metrics_port, self.liveness_port = _free_port(), _free_port()
        argv = [
            sys.executable, "-m", "treadle.cli", "operator", "run", "--namespace", JOBS_NS,
            "--kubeconfig", str(self.kubeconfig), "--bind", "127.0.0.1",
            "--metrics-port", str(self.metrics_port), "--liveness-port", str(self.liveness_port),
        ]  # fmt: skip
        out = self.log.open("ab")
        # The operator's key, as the chart gives it (every job's token derives from it).
        env = {**os.environ, "TREADLE_AUTH_KEY": "e2e operator key"}
        self.proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env
        )
        wait_for("operator liveness probe", self._alive, timeout=60)

    def _alive(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"operator exited {self.proc.returncode}: {self.log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.liveness_port}/healthz", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as r:
            return str(r.read().decode())


class Kubectl:
    """kubectl against the dev cluster, as the admin (the test's own identity)."""

    def __init__(self, cluster: kwok.DevCluster) -> None:
        self.cluster = cluster

    def __call__(
        self, *args: str, stdin: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        cmd = [str(self.cluster.bins / "kubectl"), "--kubeconfig", str(self.cluster.kubeconfig), *args]
        proc = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=120, check=False)
        if check and proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {proc.stderr.strip()}")
        return proc

    def json(self, *args: str) -> Any:
        return json.loads(self("get", *args, "-o", "json").stdout)

    def job(self, name: str) -> dict[str, Any]:
        out: dict[str, Any] = self.json("rolloutjob", name, "-n", JOBS_NS)
        return out

    def condition(self, name: str, type: str) -> dict[str, Any] | None:
        for cond in self.job(name).get("status", {}).get("conditions", []):
            if cond["type"] == type:
                out: dict[str, Any] = cond
                return out
        return None


def helm(cluster: kwok.DevCluster, *args: str) -> str:
    cmd = [str(cluster.bins / "helm"), "--kubeconfig", str(cluster.kubeconfig), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    if proc.returncode != 0:
        raise AssertionError(f"helm {' '.join(args[:2])} failed: {proc.stderr.strip()}")
    return proc.stdout


def token_kubeconfig(
    kubectl: Kubectl, path: Path, *, account: str = SERVICE_ACCOUNT, namespace: str = SYSTEM_NS
) -> None:
    """A kubeconfig authenticated as ``namespace/account`` (the operator's by default)."""
    token = kubectl("create", "token", account, "-n", namespace, "--duration=2h").stdout.strip()
    admin = yaml.safe_load(kubectl.cluster.kubeconfig.read_text())
    cluster = admin["clusters"][0]["cluster"]
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "dev", "cluster": cluster}],
        "users": [{"name": account, "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "dev", "user": account}}],
        "current-context": "sa",
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
