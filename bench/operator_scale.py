"""Operator at scale: 200 fake nodes, 50 RolloutJobs; reconcile latency, time to all Ready, memory.

A benchmark, not a test: it prints figures and writes them (with its config) to an output folder.
Everything is real except the nodes: etcd, kube-apiserver, controller-manager and scheduler on
127.0.0.1, KWOK nodes (40 % H800, 40 % H20, 20 % CPU, 8 GPUs per GPU node), and the operator as
a subprocess (``treadle operator run``), exactly as ``make cluster-up`` and the chart run it.

Phases: (1) create ``--jobs`` RolloutJobs at once (the four examples in turn, renamed) and wait
until every one is Ready; (2) add a replica to one pool of every job and wait until all are Ready again on
the new generation. Reconcile latency comes from the operator's own per-reconcile log line;
RSS is sampled from /proc every 0.5 s.

    ~/.cache/treadle/venv/bin/python bench/operator_scale.py [--nodes 200] [--jobs 50]
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import benchcli
import yaml

from treadle.devcluster import kwok, nodes

ROOT = Path(__file__).resolve().parents[1]
NAMESPACE = "bench"
RECONCILED = re.compile(r"reconciled in ([0-9.]+)s: (\d+) applied")
# kopf's line after each run of the create handler: more than one per job means kopf handled a body
# older than its own last-handled annotation (see persistence.consistency_timeout in handlers.py).
CREATION = "Creation is processed"


@dataclasses.dataclass(frozen=True)
class Config:
    nodes: int = dataclasses.field(default=200, metadata={"help": "fake nodes (40% H800, 40% H20, 20% CPU)"})
    jobs: int = dataclasses.field(default=50, metadata={"help": "RolloutJobs created at once"})
    timeout_s: float = dataclasses.field(default=900.0, metadata={"help": "give up waiting after this long"})
    cluster: str = dataclasses.field(default="treadle-bench-op", metadata={"help": "dev cluster name"})
    out: str = dataclasses.field(
        default=str(kwok.cache_dir() / "bench" / "operator_scale"), metadata={"help": "output folder"}
    )
    keep_cluster: bool = dataclasses.field(
        default=False, metadata={"help": "leave the cluster up at the end"}
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _jobs(count: int) -> list[dict[str, Any]]:
    examples = sorted((ROOT / "manifests" / "examples").glob("*.yaml"))
    out = []
    for i in range(count):
        doc = yaml.safe_load(examples[i % len(examples)].read_text())
        doc["metadata"] = {"name": f"{doc['metadata']['name']}-{i:03d}", "namespace": NAMESPACE}
        out.append(doc)
    return out


class RssSampler(threading.Thread):
    """Peak and last resident set size of one process, sampled from /proc."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.peak_kib, self.last_kib = pid, 0, 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.5):
            try:
                text = Path(f"/proc/{self.pid}/status").read_text()
            except FileNotFoundError:
                return
            match = re.search(r"VmRSS:\s+(\d+) kB", text)
            if match:
                self.last_kib = int(match.group(1))
                self.peak_kib = max(self.peak_kib, self.last_kib)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def _wait_all_ready(
    cluster: kwok.DevCluster, names: set[str], generation_of: dict[str, int], timeout: float
) -> float:
    started = time.monotonic()
    deadline = started + timeout
    while time.monotonic() < deadline:
        items = json.loads(cluster.kubectl("get", "rolloutjobs", "-n", NAMESPACE, "-o", "json"))["items"]
        ready = {
            j["metadata"]["name"]
            for j in items
            if j.get("status", {}).get("phase") == "Ready"
            and j["status"].get("observedGeneration") == j["metadata"]["generation"]
            and j["metadata"]["generation"] >= generation_of.get(j["metadata"]["name"], 1)
        }
        if names <= ready:
            return time.monotonic() - started
        time.sleep(1.0)
    raise TimeoutError(f"not all jobs Ready after {timeout}s")


def _latencies(log: Path, skip: int = 0) -> list[float]:
    lines = log.read_text().splitlines()[skip:]
    return [float(m.group(1)) for line in lines if (m := RECONCILED.search(line))]


def _summary(values: list[float]) -> dict[str, float]:
    return {
        "count": len(values),
        "p50_s": round(_percentile(values, 0.5), 4),
        "p99_s": round(_percentile(values, 0.99), 4),
        "mean_s": round(statistics.fmean(values), 4),
        "max_s": round(max(values), 4),
    }


def run(cfg: Config) -> dict[str, Any]:
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(dataclasses.asdict(cfg), indent=2))
    cluster = kwok.DevCluster(
        name=cfg.cluster, pools=nodes.scaled_pools(cfg.nodes), workdir=kwok.cache_dir() / "kwok-bench-op"
    )
    t = time.monotonic()
    cluster.up(timeout=600)
    cluster_up_s = time.monotonic() - t
    log = out / "operator.log"
    proc: subprocess.Popen[bytes] | None = None
    sampler: RssSampler | None = None
    try:
        cluster.kubectl("apply", "--server-side", "-f", str(ROOT / "manifests" / "crds"))
        # `kubectl wait` fails outright while the new CRD has no conditions yet: poll instead.
        query = '{.status.conditions[?(@.type=="Established")].status}'
        deadline = time.monotonic() + 60
        while cluster.kubectl("get", "crd", "rolloutjobs.treadle.dev", "-o", f"jsonpath={query}") != "True":
            if time.monotonic() > deadline:
                raise TimeoutError("the RolloutJob CRD was not Established within 60 s")
            time.sleep(0.5)
        cluster.kubectl("create", "namespace", NAMESPACE)
        env = dict(os.environ, KUBECONFIG=str(cluster.kubeconfig))
        argv = [
            sys.executable, "-m", "treadle.cli", "operator", "run", "--namespace", NAMESPACE,
            "--kubeconfig", str(cluster.kubeconfig), "--bind", "127.0.0.1",
            "--metrics-port", str(_free_port()), "--liveness-port", str(_free_port()),
        ]  # fmt: skip
        with log.open("wb") as sink:
            proc = subprocess.Popen(
                argv, stdout=sink, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        sampler = RssSampler(proc.pid)
        sampler.start()
        liveness = argv[argv.index("--liveness-port") + 1]
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{liveness}/healthz", timeout=2):
                    break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError(f"operator did not start; see {log}") from None
                time.sleep(0.5)
        idle_rss_kib = sampler.last_kib

        jobs = _jobs(cfg.jobs)
        names = {j["metadata"]["name"] for j in jobs}
        cluster.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(jobs), timeout=300)
        create_ready_s = _wait_all_ready(cluster, names, {}, cfg.timeout_s)
        create_lat = _latencies(log)
        create_runs = log.read_text().count(CREATION)
        skip = len(log.read_text().splitlines())

        # Add a replica to the first pool of every job: each job's update rolls one Deployment.
        for job in jobs:
            replicas = job["spec"]["pools"][0].get("replicas", 1) + 1
            patch = f'[{{"op": "replace", "path": "/spec/pools/0/replicas", "value": {replicas}}}]'
            cluster.kubectl(
                "patch", "rolloutjob", job["metadata"]["name"], "-n", NAMESPACE, "--type=json", "-p", patch
            )
        update_ready_s = _wait_all_ready(cluster, names, dict.fromkeys(names, 2), cfg.timeout_s)
        update_lat = _latencies(log, skip)
        pods = len(
            json.loads(cluster.kubectl("get", "pods", "-n", NAMESPACE, "-o", "json", timeout=300))["items"]
        )
        results = {
            "simulated_nodes": "KWOK (fake nodes; real control plane)",
            "nodes": cfg.nodes,
            "jobs": cfg.jobs,
            "pods_at_end": pods,
            "cluster_up_s": round(cluster_up_s, 1),
            "create": {
                "all_ready_s": round(create_ready_s, 1),
                "reconcile": _summary(create_lat),
                "create_handler_runs": create_runs,
            },
            "update_scale_one_pool": {
                "all_ready_s": round(update_ready_s, 1),
                "reconcile": _summary(update_lat),
            },
            "operator_rss_mib": {
                "idle": round(idle_rss_kib / 1024, 1),
                "peak": round(sampler.peak_kib / 1024, 1),
                "end": round(sampler.last_kib / 1024, 1),
            },
        }
        (out / "results.json").write_text(json.dumps(results, indent=2))
        return results
    finally:
        if sampler is not None:
            sampler.stop.set()
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        if not cfg.keep_cluster:
            cluster.down()


def main() -> int:
    cfg = benchcli.parse(Config, __doc__)
    results = run(cfg)
    print(json.dumps(results, indent=2))
    c, u, m = results["create"], results["update_scale_one_pool"], results["operator_rss_mib"]
    print(
        f"\n{cfg.jobs} RolloutJobs on {cfg.nodes} fake nodes ({results['pods_at_end']} pods): "
        f"all Ready {c['all_ready_s']} s after create ({c['create_handler_runs']} create handler runs); "
        f"reconcile p50 {c['reconcile']['p50_s']} s, "
        f"p99 {c['reconcile']['p99_s']} s; after adding a replica to one pool each: "
        f"all Ready {u['all_ready_s']} s, "
        f"reconcile p50 {u['reconcile']['p50_s']} s, p99 {u['reconcile']['p99_s']} s; "
        f"operator RSS idle {m['idle']} MiB, peak {m['peak']} MiB.\nwritten to {cfg.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
