"""Run a real control plane with fake GPU nodes through ``kwokctl --runtime binary``.

Every component listens on 127.0.0.1 only. The cluster's state lives under
``$TREADLE_CACHE/kwok/clusters/<name>``; ``down()`` stops every process kwokctl started and then
checks none is left.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from treadle.api import nodes as api_nodes
from treadle.devcluster import binaries, nodes
from treadle.devcluster.nodeagent import net


def cache_dir() -> Path:
    return Path(os.environ.get("TREADLE_CACHE", Path.home() / ".cache" / "treadle"))


class ClusterError(RuntimeError):
    """The dev cluster failed to come up or go down; the message says which step and why."""


@dataclass
class DevCluster:
    """One local Kubernetes control plane plus KWOK-managed fake node pools."""

    name: str = "treadle"
    pools: tuple[nodes.NodePool, ...] = nodes.DEFAULT_POOLS
    workdir: Path = field(default_factory=lambda: cache_dir() / "kwok")
    # Where the context is added: None keeps it in the cluster's own kubeconfig only.
    user_kubeconfig: Path | None = None
    run_nodes: int = 0
    """CPU process nodes (``treadle-run-<i>``) whose pods really run, by the node agent (needs root)."""
    run_gpu_nodes: int = 0
    """Process nodes (``treadle-run-gpu-<i>``) with SIMULATED GPUs: capacity, labels and taint only."""
    run_accelerator: str = "H20"
    run_gpus: int = 8

    def __post_init__(self) -> None:
        self.bins = binaries.bin_dir()

    @property
    def cluster_dir(self) -> Path:
        return self.workdir / "clusters" / self.name

    @property
    def kubeconfig(self) -> Path:
        return self.cluster_dir / "kubeconfig.yaml"

    @property
    def context(self) -> str:
        return f"kwok-{self.name}"

    def _env(self) -> dict[str, str]:
        env = dict(os.environ, KWOK_WORKDIR=str(self.workdir))
        env["PATH"] = f"{self.bins}{os.pathsep}{env.get('PATH', '')}"
        return env

    def _config_file(self) -> Path:
        b = self.bins
        options = {
            "runtime": "binary",
            "kubeVersion": binaries.kube_version(b),
            "bindAddress": "127.0.0.1",
            "kubeApiserverBinary": str(b / "kube-apiserver"),
            "kubeControllerManagerBinary": str(b / "kube-controller-manager"),
            "kubeSchedulerBinary": str(b / "kube-scheduler"),
            "kubectlBinary": str(b / "kubectl"),
            "etcdBinary": str(b / "etcd"),
            "kwokControllerBinary": str(b / "kwok"),
            "cacheDir": str(self.workdir / "cache"),
        }
        path = self.workdir / f"{self.name}.kwokctl.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        doc = {
            "kind": "KwokctlConfiguration",
            "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
            "options": options,
            # kwokctl's binary runtime makes KWOK manage every node; the process nodes are the node
            # agent's, so KWOK takes only the nodes annotated as its own (nodes.render_node).
            "componentsPatches": [
                {
                    "name": "kwok-controller",
                    "extraArgs": [
                        {"key": "manage-all-nodes", "value": "false", "override": True},
                        {"key": "manage-nodes-with-annotation-selector", "value": nodes.KWOK_ANNOTATION},
                    ],
                }
            ],
        }
        path.write_text(yaml.safe_dump(doc))
        return path

    def _run(self, step: str, args: list[str], timeout: float = 300, stdin: str | None = None) -> str:
        try:
            proc = subprocess.run(
                args,
                env=self._env(),
                input=stdin,
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise ClusterError(
                f"dev cluster {self.name!r}: step {step!r} timed out after {timeout}s"
            ) from exc
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip()[-2000:]
            raise ClusterError(
                f"dev cluster {self.name!r}: step {step!r} failed (exit {proc.returncode}): {tail}"
            )
        return proc.stdout

    def kubectl(self, *args: str, stdin: str | None = None, timeout: float = 120) -> str:
        cmd = [str(self.bins / "kubectl"), "--kubeconfig", str(self.kubeconfig), *args]
        return self._run("kubectl " + " ".join(args[:2]), cmd, timeout=timeout, stdin=stdin)

    def is_up(self) -> bool:
        if not self.kubeconfig.is_file():
            return False
        try:
            self.kubectl("get", "--raw", "/readyz", timeout=10)
        except ClusterError:
            return False
        return True

    def up(self, timeout: float = 180) -> None:
        """Create (or reuse) the cluster, then make sure every fake node exists and is Ready."""
        if not self.is_up():
            if self.cluster_dir.exists():
                self.down()
            args = [
                str(self.bins / "kwokctl"), "--name", self.name, "--config", str(self._config_file()),
                "create", "cluster", "--wait", f"{int(timeout)}s", "--timeout", f"{int(timeout)}s",
                "--kubeconfig", str(self.user_kubeconfig or self.kubeconfig),
            ]  # fmt: skip
            self._run("kwokctl create cluster", args, timeout=timeout + 30)
        if self.pools:
            manifest = yaml.safe_dump_all(nodes.render_pools(self.pools))
            self.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", stdin=manifest)
        if self.run_node_names():
            self._start_node_agent(timeout)
        if self.pools or self.run_node_names():  # `kubectl wait --all` fails when there is no node
            self.kubectl("wait", "--for=condition=Ready", "node", "--all", f"--timeout={int(timeout)}s",
                         timeout=timeout + 10)  # fmt: skip
        self._wait_default_service_account(timeout)

    @property
    def agent_dir(self) -> Path:
        """The node agent's state: pods' volumes and container logs (``pods/<ns>_<pod>_<uid>/``)."""
        return self.cluster_dir / "nodeagent"

    def run_node_names(self) -> list[str]:
        cpu = [f"treadle-run-{i}" for i in range(self.run_nodes)]
        return cpu + [f"treadle-run-gpu-{i}" for i in range(self.run_gpu_nodes)]

    def _agent_pid(self) -> int | None:
        pidfile = self.cluster_dir / "nodeagent.pid"
        pid = int(pidfile.read_text()) if pidfile.is_file() else None
        return pid if pid is not None and _alive(pid) else None

    def _start_node_agent(self, timeout: float) -> None:
        """Start the node agent of the process nodes (unless it runs) and wait until they exist."""
        if os.geteuid() != 0:
            raise ClusterError(
                f"dev cluster {self.name!r}: step 'node agent' needs root (a network namespace per pod); "
                "run as root or with --run-nodes 0 (KWOK nodes only)"
            )
        if self._agent_pid() is None:
            self.agent_dir.mkdir(parents=True, exist_ok=True)
            args = [sys.executable, "-m", "treadle.devcluster.nodeagent", "--cluster", self.name,
                    "--kubeconfig", str(self.kubeconfig), "--state-dir", str(self.agent_dir),
                    "--tls-cert", str(self.cluster_dir / "pki" / "admin.crt"),
                    "--tls-key", str(self.cluster_dir / "pki" / "admin.key")]  # fmt: skip
            args += [a for i in range(self.run_nodes) for a in ("--node", f"treadle-run-{i}")]
            args += [a for i in range(self.run_gpu_nodes) for a in ("--gpu-node", f"treadle-run-gpu-{i}")]
            args += ["--accelerator", self.run_accelerator, "--gpus", str(self.run_gpus)]
            log = self.cluster_dir / "logs" / "nodeagent.log"
            log.parent.mkdir(parents=True, exist_ok=True)
            with open(log, "ab") as out:
                proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                        start_new_session=True)  # fmt: skip
            (self.cluster_dir / "nodeagent.pid").write_text(str(proc.pid))
        deadline = time.monotonic() + timeout
        for node in self.run_node_names():
            while True:
                try:
                    self.kubectl("get", "node", node, timeout=10)
                    break
                except ClusterError:
                    if self._agent_pid() is None:
                        tail = (self.cluster_dir / "logs" / "nodeagent.log").read_text(errors="replace")[
                            -2000:
                        ]
                        raise ClusterError(
                            f"dev cluster {self.name!r}: step 'node agent' exited: {tail}"
                        ) from None
                    if time.monotonic() > deadline:
                        what = f"step 'node agent' did not register {node} in {timeout}s"
                        raise ClusterError(f"dev cluster {self.name!r}: {what}") from None
                    time.sleep(0.2)

    def _stop_node_agent(self) -> None:
        """SIGTERM the agent (it stops its pods and removes its network), then remove what is left."""
        if not self.agent_dir.exists():
            return  # no process node was ever started here
        if (pid := self._agent_pid()) is not None:
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 30
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        # After a killed agent: the processes still in its pods' namespaces, the namespaces, the bridge.
        net.cleanup(self.name, self.agent_dir / "net.json")
        if left := net.leftovers(self.name):
            raise ClusterError(f"dev cluster {self.name!r}: step 'down' left {', '.join(left)}")

    def _wait_default_service_account(self, timeout: float) -> None:
        # Pods are refused until the controller-manager has made the namespace's default ServiceAccount.
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                self.kubectl("get", "serviceaccount", "default", "-n", "default", timeout=10)
                return
            except ClusterError:
                time.sleep(0.5)
        raise ClusterError(
            f"dev cluster {self.name!r}: step 'default ServiceAccount' not created in {timeout}s"
        )

    def process_ids(self) -> list[int]:
        """Live processes of this cluster, from kwokctl's pid files."""
        pids: list[int] = []
        for pidfile in sorted((self.cluster_dir / "pids").glob("*.pid")):
            try:
                pid = int(pidfile.read_text().strip())
            except ValueError:
                continue
            if _alive(pid):
                pids.append(pid)
        if (agent := self._agent_pid()) is not None:
            pids.append(agent)
        return pids

    def down(self) -> None:
        """Stop every component and delete the cluster's state; no process is left behind."""
        if not self.cluster_dir.exists():
            return
        pids = self.process_ids()  # read first: kwokctl deletes the pid files with the cluster
        # The node agent first, while the API server still answers it; then the control plane.
        self._stop_node_agent()
        # A failed delete is not final: the pids read above are killed below either way.
        with contextlib.suppress(ClusterError):
            self._run(
                "kwokctl delete cluster",
                [str(self.bins / "kwokctl"), "--name", self.name, "delete", "cluster",
                 "--kubeconfig", str(self.user_kubeconfig or self.kubeconfig)],
                timeout=120,
            )  # fmt: skip
        deadline = time.monotonic() + 10
        while (alive := [p for p in pids if _alive(p)]) and time.monotonic() < deadline:
            time.sleep(0.2)
        for pid in alive:
            os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)
        if leftover := [p for p in pids if _alive(p)]:
            raise ClusterError(f"dev cluster {self.name!r}: step 'down' left processes {leftover}")
        # kwokctl leaves the state behind when its delete failed; a later up() must not reuse it.
        shutil.rmtree(self.cluster_dir, ignore_errors=True)
        (self.workdir / f"{self.name}.kwokctl.yaml").unlink(missing_ok=True)

    def nodes_by_pool(self) -> dict[str, list[str]]:
        items = json.loads(self.kubectl("get", "nodes", "-o", "json"))["items"]
        out: dict[str, list[str]] = {}
        for item in items:
            pool = item["metadata"]["labels"].get(api_nodes.POOL_LABEL, "")
            if not pool and item["metadata"].get("annotations", {}).get(nodes.PROCESS_ANNOTATION):
                pool = "process"
            out.setdefault(pool, []).append(item["metadata"]["name"])
        return out


def session_cluster(prefix: str, workdir: Path, **options: Any) -> DevCluster:
    """A cluster private to this process (``<prefix>-<pid>``), after removing those of dead sessions.

    Two test sessions on one machine then never share a control plane, and a session that was
    killed before its teardown does not leave its processes and state behind for good. ``options``
    are further ``DevCluster`` fields (pools, process nodes).
    """
    owned = re.compile(rf"{re.escape(prefix)}-(\d+)")
    clusters = workdir / "clusters"
    for path in sorted(clusters.iterdir()) if clusters.is_dir() else []:
        if (m := owned.fullmatch(path.name)) and not _alive(int(m.group(1))):
            DevCluster(name=path.name, workdir=workdir).down()
    return DevCluster(name=f"{prefix}-{os.getpid()}", workdir=workdir, **options)


def _alive(pid: int) -> bool:
    """True while ``pid`` runs; a zombie (exited, not yet reaped) counts as gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except (FileNotFoundError, IndexError):
        return False
