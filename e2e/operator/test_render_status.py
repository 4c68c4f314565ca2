"""``treadle render`` and ``treadle status`` against the operator on the dev cluster (KWOK GPU pools).

``treadle render`` of each example must list exactly the children the operator creates for it,
each with the rendered spec (server-set fields aside). ``treadle status`` of a job asking more H800
GPUs than the cluster has names the shortfall and the scheduler's "Insufficient nvidia.com/gpu".
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import op_harness
import pytest
import yaml

from treadle.api import env_vars, v1alpha1
from treadle.operator import explain, reasons
from treadle.operator.render import common as render_common

EXAMPLES = sorted((op_harness.ROOT / "manifests" / "examples").glob("*.yaml"))
# What each rendered kind carries besides metadata (the API server adds to it, never changes it).
BODY = {
    "ConfigMap": ("data",),
    "Service": ("spec",),
    "Deployment": ("spec",),
    "ServiceAccount": ("automountServiceAccountToken",),
    "Role": ("rules",),
    "RoleBinding": ("roleRef", "subjects"),
    "NetworkPolicy": ("spec",),
    "Secret": ("type",),
}
ApplyJob = Callable[[dict[str, Any]], str]


def _treadle(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "treadle.cli", *args], capture_output=True, text=True, timeout=60, check=False
    )


def _covers(server: Any, rendered: Any, where: str) -> list[str]:
    """Where ``server`` differs from ``rendered``, ignoring what the server added (defaults, ids).

    A rendered zero value (empty map or list, false, None) may be absent: Go's omitempty drops it.
    """
    if isinstance(rendered, dict):
        if not isinstance(server, dict):
            return [f"{where}: {server!r} is not a mapping"]
        out = []
        for key, value in rendered.items():
            if key not in server:
                if value not in ({}, [], None, False):
                    out.append(f"{where}.{key}: missing on the server")
                continue
            out += _covers(server[key], value, f"{where}.{key}")
        return out
    if isinstance(rendered, list):
        if not isinstance(server, list) or len(server) != len(rendered):
            return [f"{where}: {server!r} != {rendered!r}"]
        return [
            d
            for i, (s, r) in enumerate(zip(server, rendered, strict=True))
            for d in _covers(s, r, f"{where}[{i}]")
        ]
    return [] if server == rendered else [f"{where}: server {server!r} != rendered {rendered!r}"]


def _add_uid_to_prefixes(rendered: Any, uid: str) -> None:
    """The job's key and weights prefixes end in its uid (``render.common.job_prefix``), which render
    leaves out."""
    if isinstance(rendered, dict):
        if rendered.get("name") in (env_vars.KEY_PREFIX, env_vars.WEIGHTS_PREFIX) and "value" in rendered:
            rendered["value"] = f"{rendered['value']}/{uid}"
        for value in rendered.values():
            _add_uid_to_prefixes(value, uid)
    elif isinstance(rendered, list):
        for value in rendered:
            _add_uid_to_prefixes(value, uid)


def _children(kubectl: op_harness.Kubectl, job: str) -> dict[tuple[str, str], dict[str, Any]]:
    rbac = "rbac.authorization.k8s.io"
    kinds = (
        f"configmaps,services,deployments,serviceaccounts,roles.{rbac},rolebindings.{rbac},secrets,"
        "networkpolicies.networking.k8s.io"
    )
    items = kubectl.json(kinds, "-n", op_harness.JOBS_NS, "-l", f"treadle.dev/job={job}")["items"]
    return {(i["kind"], i["metadata"]["name"]): i for i in items}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_render_equals_what_the_operator_creates(
    path: Path, operator: op_harness.Operator, kubectl: op_harness.Kubectl, apply_job: ApplyJob
) -> None:
    proc = _treadle("render", str(path), "-n", op_harness.JOBS_NS)
    assert proc.returncode == 0, proc.stderr
    rendered = {(o["kind"], o["metadata"]["name"]): o for o in yaml.safe_load_all(proc.stdout)}
    name = apply_job(yaml.safe_load(path.read_text()))
    # Every child rendered exists once the operator has applied them all (it applies in one pass).
    observed = op_harness.wait_for(
        f"the children of {name}", lambda: (c := _children(kubectl, name)) and set(rendered) <= set(c) and c
    )
    assert set(observed) == set(rendered)
    uid = kubectl.job(name)["metadata"]["uid"]
    diffs = []
    for key, want in rendered.items():
        got = observed[key]
        # The uid is the one field render cannot know (the API server assigns it on create), and
        # the spec-hash annotation digests the whole object, uid included: fill it in (the owner
        # reference, the key and weights prefixes), re-stamp.
        want["metadata"]["ownerReferences"][0]["uid"] = uid
        _add_uid_to_prefixes(want, uid)
        render_common.stamp(want)
        compared = ("labels", "annotations", "ownerReferences")
        if key[0] == "Secret":
            # Its values (and so its spec hash) derive from the operator's key and the job's uid, which
            # render has not got: the same keys, not the same values.
            compared = ("labels", "ownerReferences")
            if sorted(got.get("data", {})) != sorted(want["stringData"]):
                diffs.append(
                    f"Secret/{key[1]}: keys {sorted(got.get('data', {}))} != {sorted(want['stringData'])}"
                )
        meta = {k: want["metadata"][k] for k in compared}
        diffs += _covers(got["metadata"], meta, f"{key[0]}/{key[1]}.metadata")
        for field in BODY[key[0]]:
            diffs += _covers(got.get(field), want.get(field), f"{key[0]}/{key[1]}.{field}")
    assert not diffs, "\n".join(diffs[:20])


def test_status_names_insufficient_gpus_for_a_job_asking_more_h800_than_exist(
    operator: op_harness.Operator, kubectl: op_harness.Kubectl, apply_job: ApplyJob
) -> None:
    doc = yaml.safe_load((op_harness.ROOT / "manifests" / "examples" / "swe-h800.yaml").read_text())
    doc["metadata"]["name"] = "swe-status-too-big"
    doc["spec"]["pools"][0] |= {"replicas": 5, "tensorParallelSize": 8}  # 40 H800 GPUs; the cluster has 16
    name = apply_job(doc)
    status = [name, "-n", op_harness.JOBS_NS, "--kubeconfig", str(kubectl.cluster.kubeconfig)]
    pool = doc["spec"]["pools"][0]["name"]
    expected = [
        # The job-level shortfall, from the operator's own gpu_shortfalls ...
        f"cluster: InsufficientGPUCapacity: pools {pool} ask 40 H800 GPUs",
        # ... and the scheduler's reason for the pods it turns away: two H800 nodes of 8 GPUs hold
        # two TP-8 replicas (ready once KWOK marks them so), the other three wait.
        f"pool {pool} (3 pods): InsufficientGPUCapacity: 0/",
        "Insufficient nvidia.com/gpu",
        f"{pool:<16} H800   2/5 ready",
    ]
    seen = [""]

    def blocked() -> bool:
        proc = _treadle("status", *status)
        assert proc.returncode == 0, proc.stderr
        seen[0] = proc.stdout
        return all(line in proc.stdout for line in expected)

    try:
        op_harness.wait_for(
            f"treadle status {name} to name the GPU shortage", blocked, timeout=60, interval=2
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nlast output:\n{seen[0]}") from None


def test_status_names_a_reward_gateway_that_cannot_run_while_scoring_waits(
    operator: op_harness.Operator, kubectl: op_harness.Kubectl, apply_job: ApplyJob
) -> None:
    """The second stall of issue 17: trajectories wait for scoring (the demand the scheduler writes on
    the job, written here as it would) while no gateway pod can run (the job's CPU pods asked for a
    node label no node has). ``treadle status`` names both: the gateway down with the waiting count,
    and why its pods wait."""
    doc = yaml.safe_load((op_harness.ROOT / "manifests" / "examples" / "math-tool-h20.yaml").read_text())
    doc["metadata"]["name"] = "math-status-reward"
    doc["spec"]["placement"] = {"cpu": {"nodeSelector": {"treadle.dev/no-such-pool": "cpu"}}}
    name = apply_job(doc)
    kubectl(
        "annotate", "rolloutjob", name, "-n", op_harness.JOBS_NS, f"{v1alpha1.REWARD_DEMAND_ANNOTATION}=12"
    )
    status = [name, "-n", op_harness.JOBS_NS, "--kubeconfig", str(kubectl.cluster.kubeconfig)]
    down = f"  reward: {explain.REWARD_GATEWAY_DOWN}: 12 scoring requests waiting"
    seen = [""]

    def blocked() -> bool:
        proc = _treadle("status", *status)
        assert proc.returncode == 0, proc.stderr
        seen[0] = proc.stdout
        lines = proc.stdout.splitlines()
        gateway = [
            line for line in lines if line.startswith(down) and "but the reward gateway has 0/" in line
        ]
        pods = [
            line for line in lines
            if line.startswith("  reward (") and f": {reasons.UNSCHEDULABLE}: " in line
            and "didn't match Pod's node affinity/selector" in line
        ]  # fmt: skip
        return bool(gateway and pods)

    try:
        op_harness.wait_for(
            f"treadle status {name} to name the reward gateway", blocked, timeout=60, interval=2
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nlast output:\n{seen[0]}") from None


def test_status_of_a_missing_job_exits_1(operator: op_harness.Operator, kubectl: op_harness.Kubectl) -> None:
    proc = _treadle(
        "status", "no-such-job", "-n", op_harness.JOBS_NS, "--kubeconfig", str(kubectl.cluster.kubeconfig)
    )
    assert proc.returncode == 1
    assert f"RolloutJob {op_harness.JOBS_NS}/no-such-job not found" in proc.stderr
