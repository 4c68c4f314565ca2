"""The operator on a real API server with KWOK GPU pools, running as the chart's ServiceAccount.

Covers: each example lands on the right pool with TP GPUs per pod and reaches Ready; printer
columns; scaling one pool leaves the other children untouched; suspend and resume; delete with
the operator down still removes every child (ownerReferences, no finalizers); the API server
rejects every manifest in manifests/invalid naming its field; a job asking more H800 GPUs than
exist goes Degraded with InsufficientGPUCapacity while another job stays Ready; metrics; a job
short of GPUs on purpose (blocker pods) is Degraded, then Ready once they go; the scheduler's
reward-demand reporter, as the job's own ServiceAccount, scales the reward gateway 0 -> N -> 0;
``treadle operator reshape`` changes one pool's TP and re-creates only that pool's pods; valid
``tasks[].sampling`` modes pass a server-side dry run.
"""

from __future__ import annotations

import asyncio
import copy
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kubernetes
import op_harness
import pytest
import yaml

from treadle import kubeapi
from treadle.api import v1alpha1
from treadle.services.scheduler import jobreport, protocol

EXAMPLES = sorted((op_harness.ROOT / "manifests" / "examples").glob("*.yaml"))
INVALID = sorted((op_harness.ROOT / "manifests" / "invalid").glob("*.yaml"))
ApplyJob = Callable[[dict[str, Any]], str]


def _doc(path: Path) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(path.read_text())
    return doc


def _header(path: Path, key: str) -> str | None:
    for line in path.read_text().splitlines():
        if line.startswith(f"# {key}:"):
            return line.split(":", 1)[1].strip()
    return None


def _ready(kubectl: op_harness.Kubectl, name: str) -> bool:
    job = kubectl.job(name)
    st = job.get("status", {})
    cond = kubectl.condition(name, "Ready")
    return bool(
        cond
        and cond["status"] == "True"
        and st.get("observedGeneration") == job["metadata"]["generation"]
        and st.get("phase") == "Ready"
    )


def _pods(kubectl: op_harness.Kubectl, job: str, component: str | None = None) -> list[dict[str, Any]]:
    selector = f"treadle.dev/job={job}" + (f",treadle.dev/component={component}" if component else "")
    items: list[dict[str, Any]] = kubectl.json("pods", "-n", op_harness.JOBS_NS, "-l", selector)["items"]
    return [p for p in items if not p["metadata"].get("deletionTimestamp")]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_lands_on_its_pools_and_becomes_ready(
    path: Path, operator: op_harness.Operator, kubectl: op_harness.Kubectl, apply_job: ApplyJob
) -> None:
    doc = _doc(path)
    name = apply_job(doc)
    op_harness.wait_for(f"{name} Ready", lambda: _ready(kubectl, name))
    nodes = {n["metadata"]["name"]: n["metadata"]["labels"] for n in kubectl.json("nodes")["items"]}
    for pool in doc["spec"]["pools"]:
        pods = _pods(kubectl, name, "pool")
        pods = [p for p in pods if p["metadata"]["labels"]["treadle.dev/pool"] == pool["name"]]
        assert len(pods) == pool["replicas"], pool["name"]
        for pod in pods:
            assert pod["status"]["phase"] == "Running"
            node = nodes[pod["spec"]["nodeName"]]
            assert node["treadle.dev/accelerator"] == pool["accelerator"], (
                pool["name"],
                pod["spec"]["nodeName"],
            )
            vllm = next(c for c in pod["spec"]["containers"] if c["name"] == "vllm")
            assert vllm["resources"]["limits"]["nvidia.com/gpu"] == str(pool.get("tensorParallelSize", 1))
    # CPU components stay off GPU nodes (by the rendered affinity; no label is required of CPU nodes).
    for component in ("env", "scheduler", "placement", "buffer"):
        for pod in _pods(kubectl, name, component):
            labels = nodes[pod["spec"]["nodeName"]]
            assert labels.get("treadle.dev/accelerator", "none") == "none", (
                component,
                pod["spec"]["nodeName"],
            )
            assert "nvidia.com/gpu.present" not in labels
    job = kubectl.job(name)
    assert job["status"]["poolsReady"] == f"{len(doc['spec']['pools'])}/{len(doc['spec']['pools'])}"
    assert not job["metadata"].get("finalizers"), "the operator must not add finalizers"
    wide = kubectl("get", "rolloutjob", name, "-n", op_harness.JOBS_NS, "-o", "wide").stdout.splitlines()
    assert wide[0].split() == ["NAME", "PHASE", "POOLS", "POLICY", "STEP", "REWARD", "REASON", "AGE"]
    # No version committed yet: no reward, an empty cell.
    assert wide[1].split()[:6] == [name, "Ready", job["status"]["poolsReady"], "0", "0", "AllResourcesReady"]
    events = kubectl.json(
        "events", "-n", op_harness.JOBS_NS, "--field-selector", f"involvedObject.name={name}"
    )["items"]
    assert {"ChildrenApplied", "AllResourcesReady"} <= {e["reason"] for e in events}


def _versions(kubectl: op_harness.Kubectl, job: str) -> dict[str, str]:
    out = {}
    for kind in ("deployments", "services", "configmaps", "secrets", "networkpolicies"):
        for item in kubectl.json(kind, "-n", op_harness.JOBS_NS, "-l", f"treadle.dev/job={job}")["items"]:
            out[f"{kind}/{item['metadata']['name']}"] = item["metadata"]["resourceVersion"]
    return out


def test_scaling_one_pool_rolls_only_that_pool(
    operator: op_harness.Operator, kubectl: op_harness.Kubectl, apply_job: ApplyJob
) -> None:
    doc = _doc(op_harness.ROOT / "manifests" / "examples" / "multi-task-mixed.yaml")
    name = apply_job(doc)
    op_harness.wait_for(f"{name} Ready", lambda: _ready(kubectl, name))
    before = _versions(kubectl, name)
    patch = '[{"op": "replace", "path": "/spec/pools/1/replicas", "value": 1}]'
    kubectl("patch", "rolloutjob", name, "-n", op_harness.JOBS_NS, "--type=json", "-p", patch)
    op_harness.wait_for("decode pool scaled to 1", lambda: len(
        [p for p in _pods(kubectl, name, "pool") if p["metadata"]["labels"]["treadle.dev/pool"] == "decode"]
    ) == 1)  # fmt: skip
    op_harness.wait_for(f"{name} Ready again", lambda: _ready(kubectl, name))
    after = _versions(kubectl, name)
    changed = sorted(k for k in before if after.get(k) != before[k])
    assert changed == ["configmaps/multi-task-config", "deployments/multi-task-pool-decode"]
    pools = {p["name"]: p for p in kubectl.job(name)["status"]["pools"]}
    assert pools["decode"]["desired"] == 1 and pools["decode"]["ready"] == 1
    assert pools["prefill"]["desired"] == 2


def test_suspend_scales_to_zero_and_resume_restores(
    operator: op_harness.Operator, kubectl: op_harness.Kubectl, apply_job: ApplyJob
) -> None:
    doc = _doc(op_harness.ROOT / "manifests" / "examples" / "two-agent-flexmarl.yaml")
    name = apply_job(doc)
    op_harness.wait_for(f"{name} Ready", lambda: _ready(kubectl, name))
    running = len(_pods(kubectl, name))
    kubectl(
        "patch",
        "rolloutjob",
        name,
        "-n",
        op_harness.JOBS_NS,
        "--type=merge",
        "-p",
        '{"spec": {"suspend": true}}',
    )
    op_harness.wait_for("no pods while suspended", lambda: not _pods(kubectl, name))
    op_harness.wait_for("phase Suspended", lambda: kubectl.job(name)["status"].get("phase") == "Suspended")
    assert (kubectl.condition(name, "Suspended") or {}).get("status") == "True"
    kubectl(
        "patch",
        "rolloutjob",
        name,
        "-n",
        op_harness.JOBS_NS,
        "--type=merge",
        "-p",
        '{"spec": {"suspend": false}}',
    )
    op_harness.wait_for(f"{name} Ready after resume", lambda: _ready(kubectl, name))
    assert len(_pods(kubectl, name)) == running
    assert (kubectl.condition(name, "Suspended") or {}).get("status") == "False"


def test_delete_with_operator_down_removes_every_child(
    operator: op_harness.Operator, kubectl: op_harness.Kubectl, apply_job: ApplyJob
) -> None:
    doc = copy.deepcopy(_doc(op_harness.ROOT / "manifests" / "examples" / "math-tool-h20.yaml"))
    doc["metadata"]["name"] = "math-delete"
    name = apply_job(doc)
    op_harness.wait_for(f"{name} Ready", lambda: _ready(kubectl, name))
    assert _versions(kubectl, name)
    operator.stop()
    try:
        kubectl("delete", "rolloutjob", name, "-n", op_harness.JOBS_NS, "--wait=true", "--timeout=60s")
        op_harness.wait_for(
            "garbage collection of every child",
            lambda: not _versions(kubectl, name) and not _pods(kubectl, name),
        )
    finally:
        operator.start()


def _trainer_jobs(kubectl: op_harness.Kubectl, job: str) -> list[dict[str, Any]]:
    selector = f"treadle.dev/job={job},treadle.dev/component=trainer"
    items: list[dict[str, Any]] = kubectl.json("jobs", "-n", op_harness.JOBS_NS, "-l", selector)["items"]
    return [j for j in items if not j["metadata"].get("deletionTimestamp")]


def test_the_trainer_job_lands_on_its_gpus_is_replaced_when_changed_and_collected(
    operator: op_harness.Operator, kubectl: op_harness.Kubectl, apply_job: ApplyJob
) -> None:
    """``spec.trainer`` as a batch/v1 Job through the chart's RBAC: its pod on an H800 node with its
    GPU; a changed trainer is a new Job (the old one pruned); deleting the job collects it."""
    doc = copy.deepcopy(_doc(op_harness.ROOT / "manifests" / "examples" / "math-tool-h20.yaml"))
    doc["metadata"]["name"] = "math-trainer"
    doc["spec"]["trainer"] = {"accelerator": "H800", "gpus": 1, "steps": 5}
    name = apply_job(doc)
    op_harness.wait_for(f"{name} Ready", lambda: _ready(kubectl, name))
    op_harness.wait_for("the trainer Job", lambda: len(_trainer_jobs(kubectl, name)) == 1)
    (first,) = _trainer_jobs(kubectl, name)
    assert first["metadata"]["ownerReferences"][0]["name"] == name
    # KWOK's fake nodes run no container: they mark a Job's pod Succeeded as soon as it is bound.
    op_harness.wait_for("the trainer's pod bound", lambda: any(
        p["spec"].get("nodeName") and p["status"].get("phase") in ("Running", "Succeeded")
        for p in _pods(kubectl, name, "trainer")
    ))  # fmt: skip
    nodes = {n["metadata"]["name"]: n["metadata"]["labels"] for n in kubectl.json("nodes")["items"]}
    (pod,) = _pods(kubectl, name, "trainer")
    assert nodes[pod["spec"]["nodeName"]]["treadle.dev/accelerator"] == "H800"
    assert pod["spec"]["containers"][0]["command"] == ["python", "-m", "treadle.trainer.job"]
    patch = '[{"op": "replace", "path": "/spec/trainer/steps", "value": 6}]'
    kubectl("patch", "rolloutjob", name, "-n", op_harness.JOBS_NS, "--type=json", "-p", patch)
    op_harness.wait_for("a new trainer Job in place of the old", lambda: [
        j["metadata"]["name"] for j in _trainer_jobs(kubectl, name)
    ] not in ([], [first["metadata"]["name"]]) and len(_trainer_jobs(kubectl, name)) == 1)  # fmt: skip
    kubectl("delete", "rolloutjob", name, "-n", op_harness.JOBS_NS, "--wait=true", "--timeout=60s")
    op_harness.wait_for("garbage collection of the trainer", lambda: not _trainer_jobs(kubectl, name))


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.stem)
def test_invalid_manifest_is_rejected_by_the_api_server_naming_the_field(
    path: Path, chart: str, kubectl: op_harness.Kubectl, apply_job: ApplyJob
) -> None:
    field = _header(path, "field")
    assert field
    doc = _doc(path)
    if base := _header(path, "update-of"):
        original = _doc(op_harness.ROOT / "manifests" / "examples" / base)
        original["metadata"]["name"] = doc["metadata"]["name"] = f"immutable-{path.stem[:2]}"
        apply_job(original)
        proc = kubectl("apply", "-n", op_harness.JOBS_NS, "-f", "-", stdin=yaml.safe_dump(doc), check=False)
    else:
        proc = kubectl(
            "apply",
            "--dry-run=server",
            "-n",
            op_harness.JOBS_NS,
            "-f",
            "-",
            stdin=yaml.safe_dump(doc),
            check=False,
        )
    assert proc.returncode != 0, f"{path.name} was accepted"
    assert field in proc.stderr, proc.stderr


def test_more_h800_gpus_than_exist_is_degraded_and_nothing_else_breaks(
    operator: op_harness.Operator, kubectl: op_harness.Kubectl, apply_job: ApplyJob
) -> None:
    healthy = apply_job(_doc(op_harness.ROOT / "manifests" / "examples" / "math-tool-h20.yaml"))
    doc = _doc(op_harness.ROOT / "manifests" / "examples" / "swe-h800.yaml")
    doc["metadata"]["name"] = "swe-too-big"
    doc["spec"]["pools"][0] |= {"replicas": 5, "tensorParallelSize": 8}  # 40 H800 GPUs; the cluster has 16
    big = apply_job(doc)

    def degraded() -> dict[str, Any] | None:
        cond = kubectl.condition(big, "Degraded")
        return cond if cond and cond["status"] == "True" else None

    cond = op_harness.wait_for(f"{big} Degraded", degraded)
    assert cond["reason"] == "InsufficientGPUCapacity"
    assert (
        "ask 40 H800 GPUs" in cond["message"]
        and "the cluster has 16 allocatable H800 GPUs" in cond["message"]
    )
    assert kubectl.job(big)["status"]["phase"] == "Degraded"
    op_harness.wait_for(f"{healthy} Ready beside it", lambda: _ready(kubectl, healthy))
    events = kubectl.json(
        "events", "-n", op_harness.JOBS_NS, "--field-selector", f"involvedObject.name={big}"
    )["items"]
    assert any(e["reason"] == "InsufficientGPUCapacity" and e["type"] == "Warning" for e in events)


def test_operator_metrics(
    operator: op_harness.Operator, kubectl: op_harness.Kubectl, apply_job: ApplyJob
) -> None:
    name = apply_job(_doc(op_harness.ROOT / "manifests" / "examples" / "swe-h800.yaml"))
    op_harness.wait_for(f"{name} Ready", lambda: _ready(kubectl, name))

    def scrape() -> str | None:
        text = operator.metrics()
        return text if f'name="{name}"' in text else None

    text = op_harness.wait_for("job series in metrics", scrape, timeout=30)
    assert 'treadle_operator_reconcile_total{result="success"}' in text
    assert "treadle_operator_reconcile_seconds_bucket" in text
    ready = [line for line in text.splitlines() if line.startswith("treadle_operator_job_condition{")
             and f'name="{name}"' in line and 'condition="Ready"' in line]  # fmt: skip
    assert ready and ready[0].endswith(" 1.0"), ready
    assert "treadle_operator_pool_replicas" in text


def test_hand_scaled_child_is_restored(
    operator: op_harness.Operator, kubectl: op_harness.Kubectl, apply_job: ApplyJob
) -> None:
    doc = _doc(op_harness.ROOT / "manifests" / "examples" / "swe-h800.yaml")
    doc["metadata"]["name"] = "swe-drift"
    name = apply_job(doc)
    op_harness.wait_for(f"{name} Ready", lambda: _ready(kubectl, name))
    kubectl("scale", "deployment", f"{name}-env", "-n", op_harness.JOBS_NS, "--replicas=0")

    def restored() -> bool:
        dep = kubectl.json("deployment", f"{name}-env", "-n", op_harness.JOBS_NS)
        return bool(dep["spec"]["replicas"] == 4 and dep.get("status", {}).get("readyReplicas") == 4)

    op_harness.wait_for("env Deployment scaled back to the spec's 4 replicas", restored)
    op_harness.wait_for(f"{name} Ready again", lambda: _ready(kubectl, name))


def _gpu_blocker(index: int, accelerator: str, gpus: int) -> dict[str, Any]:
    """A bare pod (no job label) that holds ``gpus`` GPUs of one node of ``accelerator``."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"gpu-blocker-{index}", "namespace": op_harness.JOBS_NS},
        "spec": {
            "nodeSelector": {"treadle.dev/accelerator": accelerator},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [{"name": "hold", "image": "busybox", "resources": {
                "requests": {"nvidia.com/gpu": str(gpus)}, "limits": {"nvidia.com/gpu": str(gpus)}}}],
        },
    }  # fmt: skip


def test_gpu_shortage_degrades_then_clears_once_the_gpus_are_free(
    operator: op_harness.Operator, kubectl: op_harness.Kubectl, apply_job: ApplyJob
) -> None:
    """Regression: a job whose pods waited for GPUs stayed Degraded after they ran (stale pod index)."""
    nodes = kubectl.json("nodes", "-l", "treadle.dev/accelerator=H800")["items"]
    blockers = [_gpu_blocker(i, "H800", int(n["status"]["allocatable"]["nvidia.com/gpu"]))
                for i, n in enumerate(nodes)]  # fmt: skip
    for pod in blockers:
        kubectl("apply", "-f", "-", stdin=yaml.safe_dump(pod))
    try:
        op_harness.wait_for("blockers holding every H800 GPU", lambda: all(
            kubectl.json("pod", p["metadata"]["name"], "-n", op_harness.JOBS_NS)["status"].get("phase")
            == "Running" for p in blockers))  # fmt: skip
        doc = _doc(op_harness.ROOT / "manifests" / "examples" / "swe-h800.yaml")
        doc["metadata"]["name"] = "swe-shortage"
        name = apply_job(doc)

        def degraded() -> dict[str, Any] | None:
            cond = kubectl.condition(name, "Degraded")
            return cond if cond and cond["status"] == "True" else None

        cond = op_harness.wait_for(f"{name} Degraded while the blockers hold the GPUs", degraded)
        assert cond["reason"] == "InsufficientGPUCapacity"
        assert cond["message"].startswith("pool prefill: ") and "nvidia.com/gpu" in cond["message"]
        assert kubectl.job(name)["status"]["phase"] == "Degraded"
    finally:
        for pod in blockers:
            kubectl("delete", "pod", pod["metadata"]["name"], "-n", op_harness.JOBS_NS, "--wait=true",
                    "--ignore-not-found", "--timeout=60s", check=False)  # fmt: skip

    def recovered() -> bool:
        cond = kubectl.condition(name, "Degraded") or {}
        return _ready(kubectl, name) and cond.get("status") == "False"

    op_harness.wait_for(f"{name} Ready and no longer Degraded", recovered, timeout=120)
    cond = kubectl.condition(name, "Degraded") or {}
    assert cond.get("reason") == "AsExpected"
    assert all(p["status"]["phase"] == "Running" for p in _pods(kubectl, name, "pool"))


def test_reward_demand_scales_the_gateway(
    operator: op_harness.Operator,
    kubectl: op_harness.Kubectl,
    apply_job: ApplyJob,
    tmp_path: Path,
) -> None:
    """The scheduler's reporter, as the job's own ServiceAccount, drives the reward gateway 0 -> N -> 0."""
    doc = _doc(op_harness.ROOT / "manifests" / "examples" / "swe-h800.yaml")  # scaleToZero, maxReplicas 4
    doc["metadata"]["name"] = "swe-demand"
    name = apply_job(doc)
    op_harness.wait_for(f"{name} Ready", lambda: _ready(kubectl, name))
    gateway = f"{name}-reward"

    def replicas() -> tuple[int, int]:
        dep = kubectl.json("deployment", gateway, "-n", op_harness.JOBS_NS)
        return dep["spec"]["replicas"], len(_pods(kubectl, name, "reward"))

    assert replicas() == (0, 0)
    config = tmp_path / "scheduler.kubeconfig"
    op_harness.token_kubeconfig(kubectl, config, account=f"{name}-scheduler", namespace=op_harness.JOBS_NS)
    environ = {"TREADLE_JOB": name, "TREADLE_NAMESPACE": op_harness.JOBS_NS, "KUBECONFIG": str(config)}

    async def report(*values: int) -> tuple[int, int]:
        reporter = jobreport.JobReporter.from_env(environ)
        assert reporter is not None
        try:
            for value in values:
                await reporter.report_demand(value)
        finally:
            await reporter.aclose()
        return reporter.patches, reporter.errors

    assert asyncio.run(report(100)) == (1, 0)  # ceil(100 / 32) = 4 = maxReplicas
    annotations = kubectl.job(name)["metadata"]["annotations"]
    assert annotations["treadle.dev/reward-demand"] == "100"
    op_harness.wait_for("reward gateway scaled up to 4", lambda: replicas() == (4, 4))
    op_harness.wait_for(f"{name} Ready with its gateway", lambda: _ready(kubectl, name))

    # The trainer's progress, as the scheduler writes it on each commit: the job's status subresource.
    async def progress() -> tuple[int, int]:
        reporter = jobreport.JobReporter.from_env(environ)
        assert reporter is not None
        try:
            await reporter.report_progress(protocol.Progress(version=2, step=2, mean_reward=0.375))
        finally:
            await reporter.aclose()
        return reporter.patches, reporter.errors

    assert asyncio.run(progress()) == (1, 0)
    wanted = {"policyVersion": 2, "step": 2, "meanReward": 0.375}
    assert {k: kubectl.job(name)["status"].get(k) for k in wanted} == wanted
    assert asyncio.run(report(40, 40)) == (1, 0)  # the repeat is not written
    op_harness.wait_for("reward gateway at ceil(40 / 32) = 2", lambda: replicas() == (2, 2))
    # The operator re-computed the status since (the gateway scaled) and left the trainer's fields.
    assert {k: kubectl.job(name)["status"].get(k) for k in wanted} == wanted
    wide = kubectl("get", "rolloutjob", name, "-n", op_harness.JOBS_NS, "-o", "wide").stdout.splitlines()
    assert wide[1].split()[3:6] == ["2", "2", "0.375"]  # POLICY, STEP, REWARD
    assert asyncio.run(report(0)) == (1, 0)
    op_harness.wait_for("reward gateway back to zero", lambda: replicas() == (0, 0))
    op_harness.wait_for(f"{name} Ready while idle", lambda: _ready(kubectl, name))
    # Least privilege: the scheduler's identity may patch its own job and nothing else.
    other = dict(environ, TREADLE_JOB="some-other-job")
    reporter = jobreport.JobReporter.from_env(other)
    assert reporter is not None

    async def forbidden() -> int:
        try:
            await reporter.report_demand(5)
        finally:
            await reporter.aclose()
        return reporter.errors

    assert asyncio.run(forbidden()) == 1
    account = f"system:serviceaccount:{op_harness.JOBS_NS}:{name}-scheduler"
    denied = kubectl("auth", "can-i", "get", "pods", "-n", op_harness.JOBS_NS, f"--as={account}", check=False)
    assert denied.stdout.strip() == "no"
    # RBAC lets it patch its job; the chart's admission policy lets it change only its own annotation.
    client = kubeapi.Client.from_environment(str(config))
    path = kubeapi.JOBS_PATH.format(ns=op_harness.JOBS_NS) + f"/{name}"

    def patch(body: dict[str, Any]) -> str:
        try:
            client._call("PATCH", path, body=body, content_type="application/merge-patch+json")
        except kubernetes.client.ApiException as exc:
            return str(exc.body)
        return ""

    refused: dict[str, dict[str, Any]] = {
        "its spec": {"spec": {"suspend": True}},
        "another annotation": {"metadata": {"annotations": {"treadle.dev/feeder-problem": "forged"}}},
        "its labels": {"metadata": {"labels": {"forged": "yes"}}},
    }
    for what, body in refused.items():
        assert "ValidatingAdmissionPolicy" in patch(body), what
    assert not kubectl.job(name)["spec"].get("suspend")
    assert patch({"metadata": {"annotations": {"treadle.dev/reward-demand": "0"}}}) == ""
    client.close()


def test_reshape_changes_one_pools_tp_and_leaves_the_rest(
    operator: op_harness.Operator, kubectl: op_harness.Kubectl, apply_job: ApplyJob, tmp_path: Path
) -> None:
    """``treadle operator reshape`` applies a Heddle plan; only that pool's pods are re-created."""
    doc = _doc(op_harness.ROOT / "manifests" / "examples" / "swe-h800.yaml")  # prefill: 2 x TP4
    doc["metadata"]["name"] = "swe-reshape"
    name = apply_job(doc)
    op_harness.wait_for(f"{name} Ready", lambda: _ready(kubectl, name))
    before = _versions(kubectl, name)
    pool_pods = {p["metadata"]["uid"] for p in _pods(kubectl, name, "pool")}
    other_pods = {p["metadata"]["uid"] for p in _pods(kubectl, name)} - pool_pods
    generation = kubectl.job(name)["metadata"]["generation"]

    def cli(plan: dict[str, Any]) -> subprocess.CompletedProcess[str]:
        path = tmp_path / "plan.yaml"
        path.write_text(yaml.safe_dump(plan))
        argv = [sys.executable, "-m", "treadle.cli", "operator", "reshape", name, "--plan", str(path),
                "-n", op_harness.JOBS_NS, "--kubeconfig", str(kubectl.cluster.kubeconfig)]  # fmt: skip
        return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)

    bad = cli({"agent": "coder", "replicas": {16: 1}})  # no node has 16 H800 GPUs
    assert bad.returncode == 2 and "spec.pools[0].tensorParallelSize" in bad.stderr, bad.stderr
    assert kubectl.job(name)["metadata"]["generation"] == generation  # nothing written

    done = cli({"agent": "coder", "replicas": {8: 1}})
    assert done.returncode == 0, done.stderr
    assert f"{op_harness.JOBS_NS}/{name} prefill: 2 x TP4 -> 1 x TP8" in done.stdout

    def reshaped() -> list[dict[str, Any]] | None:
        pods = _pods(kubectl, name, "pool")
        new = [
            p for p in pods if p["metadata"]["uid"] not in pool_pods and p["status"].get("phase") == "Running"
        ]
        return new if len(pods) == 1 and len(new) == 1 else None

    (pod,) = op_harness.wait_for("one TP8 prefill pod in place of two TP4 pods", reshaped)
    vllm = next(c for c in pod["spec"]["containers"] if c["name"] == "vllm")
    assert vllm["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert "--tensor-parallel-size" in vllm["args"] and "8" in vllm["args"]
    op_harness.wait_for(f"{name} Ready after the reshape", lambda: _ready(kubectl, name))
    after = _versions(kubectl, name)
    changed = sorted(k for k in before if after.get(k) != before[k])
    assert changed == [f"configmaps/{name}-config", f"deployments/{name}-pool-prefill"]
    assert other_pods <= {p["metadata"]["uid"] for p in _pods(kubectl, name)}
    (pool,) = kubectl.job(name)["status"]["pools"]
    assert (pool["desired"], pool["ready"], pool["gpus"]) == (1, 1, 8)


def _sampling_job(name: str, **task: Any) -> dict[str, Any]:
    return {
        "apiVersion": v1alpha1.API_VERSION,
        "kind": v1alpha1.KIND,
        "metadata": {"name": name},
        "spec": {
            "agents": [{"name": "a", "model": "m"}],
            "pools": [{"name": "p", "agent": "a", "accelerator": "H20"}],
            "tasks": [{"name": "t", "agents": ["a"], "environment": "math-tool", "reward": "math", **task}],
        },
    }


@pytest.mark.parametrize(
    ("name", "task"),
    [
        ("darts-defaults", {"sampling": {"mode": "darts"}}),
        (
            "darts-full",
            {"sampling": {"mode": "darts", "mUp": 12, "longEnd": 2, "lambda": 0.1, "emaDecay": 0.9}},
        ),
        ("redundancy-only", {"redundancy": 0.5}),
        ("redundant-named", {"redundancy": 0.5, "sampling": {"mode": "redundant"}}),
        ("standard-named", {"sampling": {"mode": "standard"}}),
    ],
)
def test_valid_sampling_is_accepted_by_the_api_server(
    name: str, task: dict[str, Any], chart: str, kubectl: op_harness.Kubectl
) -> None:
    """The other side of manifests/invalid/18-20: a darts task, a redundancy-only task (no sampling)
    and named modes pass a server-side dry run; the stored sampling stays as given ({} when absent:
    no mode, as the Python model has it)."""
    doc = _sampling_job(name, **task)
    v1alpha1.parse_job(doc)  # the Python side accepts it too
    proc = kubectl(
        "apply", "--dry-run=server", "-n", op_harness.JOBS_NS, "-o", "json", "-f", "-",
        stdin=yaml.safe_dump(doc), check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    stored = json.loads(proc.stdout)["spec"]["tasks"][0]
    assert stored["sampling"] == task.get("sampling", {})
