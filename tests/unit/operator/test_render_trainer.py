"""The trainer's Job (``spec.trainer``): snapshot, what its pod carries, where it runs, how it changes."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import operator_examples
import pytest
import yaml

from treadle.api import env_vars, nodes, v1alpha1
from treadle.operator import config, diff, kube, render
from treadle.operator.render import common as render_common
from treadle.operator.render import pool as render_pool
from treadle.operator.render import trainer as render_trainer

SNAPSHOTS = Path(__file__).parent / "snapshots"
CFG = config.OperatorConfig()
MATH = operator_examples.ROOT / "manifests" / "examples" / "math-tool-h20.yaml"
TRAINER: dict[str, Any] = {
    "accelerator": "H800",
    "gpus": 2,
    "steps": 50,
    "learningRate": 1e-5,
    "env": [{"name": "HF_HOME", "value": "/cache/hf"}],
    "tolerations": [{"key": "team", "operator": "Equal", "value": "rl", "effect": "NoSchedule"}],
    "nodeSelector": {"topology.kubernetes.io/zone": "z1"},
}


def with_trainer(trainer: dict[str, Any] | None = TRAINER, **spec: Any) -> v1alpha1.RolloutJob:
    doc = yaml.safe_load(MATH.read_text())
    doc["metadata"] |= {"namespace": "team-a", "uid": "0000-uid-trainer", "generation": 1}
    if trainer is not None:
        doc["spec"]["trainer"] = trainer
    doc["spec"] |= spec
    return v1alpha1.parse_job(doc)


def job_of(children: list[dict[str, Any]]) -> dict[str, Any]:
    (out,) = [c for c in children if c["kind"] == "Job"]
    return out


def test_snapshot() -> None:
    """Set TREADLE_UPDATE_SNAPSHOTS=1 to rewrite after an intended change, then review the diff."""
    text = yaml.safe_dump(job_of(render.render_children(with_trainer(), CFG)), sort_keys=True)
    snap = SNAPSHOTS / "math-tool-h20-trainer.yaml"
    if os.environ.get("TREADLE_UPDATE_SNAPSHOTS") == "1":
        snap.write_text(text)
    assert snap.is_file(), f"{snap} missing: run with TREADLE_UPDATE_SNAPSHOTS=1"
    assert text == snap.read_text()


def test_no_trainer_no_job() -> None:
    assert [c for c in render.render_children(with_trainer(None), CFG) if c["kind"] == "Job"] == []


def test_the_pod_runs_the_reference_trainer_with_the_sdks_endpoints() -> None:
    job = with_trainer()
    rendered = job_of(render.render_children(job, CFG))
    assert rendered["apiVersion"] == "batch/v1" and kube.COLLECTIONS["Job"].startswith("/apis/batch/v1/")
    meta = rendered["metadata"]
    assert meta["ownerReferences"] == [render_common.owner_reference(job)]  # garbage-collected with the job
    assert meta["annotations"][render_common.HASH_ANNOTATION] == render_common.spec_hash(rendered)
    pod = rendered["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "OnFailure" and pod["automountServiceAccountToken"] is False
    (c,) = pod["containers"]
    assert c["command"] == ["python", "-m", "treadle.trainer.job"]
    assert c["image"] == job.spec.agents[0].image  # torch, transformers and Treadle
    env = {e["name"]: e["value"] for e in c["env"]}
    # Every address the SDK discovers, the job file, and the store the engines pull from.
    for var in (env_vars.CONFIG, env_vars.SCHEDULER_ADDR, env_vars.BUFFER_ADDR, env_vars.PLACEMENT_ADDR,
                env_vars.WEIGHTS_PREFIX, env_vars.WEIGHTS_MASTER, env_vars.WEIGHTS_METADATA):  # fmt: skip
        assert env[var], var
    assert env[env_vars.WEIGHTS_PREFIX] == "team-a/math-tool/0000-uid-trainer"  # its versions only
    assert env["HF_HOME"] == "/cache/hf"
    names = [e["name"] for e in c["env"]]
    assert len(names) == len(set(names))  # server-side apply refuses a repeated key of a map list
    assert {e["name"] for e in c["env"] if e["name"].startswith("TREADLE_")} <= env_vars.RENDERED
    assert {"name": "treadle-config", "mountPath": render_common.CONFIG_MOUNT, "readOnly": True} in c[
        "volumeMounts"
    ]


def test_gpus_and_node_selection_come_from_the_spec() -> None:
    pod = job_of(render.render_children(with_trainer(), CFG))["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["resources"]["limits"][nodes.GPU_RESOURCE] == "2"
    assert pod["nodeSelector"] == {"topology.kubernetes.io/zone": "z1", nodes.ACCELERATOR_LABEL: "H800"}
    assert pod["tolerations"] == [
        {"key": nodes.GPU_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"},
        {"key": "team", "operator": "Equal", "value": "rl", "effect": "NoSchedule"},
    ]
    cpu_only = job_of(render.render_children(with_trainer({"steps": 3}), CFG))["spec"]["template"]["spec"]
    assert "nodeSelector" not in cpu_only and "tolerations" not in cpu_only
    assert nodes.GPU_RESOURCE not in cpu_only["containers"][0]["resources"]["limits"]


def test_local_weights_mount_the_engines_directory() -> None:
    job = with_trainer(weights={"store": "local", "replicas": 1})
    pod = job_of(render.render_children(job, CFG))["spec"]["template"]["spec"]
    env = {e["name"]: e["value"] for e in pod["containers"][0]["env"]}
    assert env[env_vars.WEIGHTS_DIR] == render_pool.LOCAL_WEIGHTS_DIR
    own = f"{render_pool.LOCAL_WEIGHTS_DIR}/{job.namespace}/{job.name}"  # only the job's own versions
    assert {"name": "weights", "hostPath": {"path": own, "type": "DirectoryOrCreate"}} in pod["volumes"]
    assert {"name": "weights", "mountPath": own} in pod["containers"][0]["volumeMounts"]


def test_a_changed_trainer_is_a_new_job_and_suspend_changes_it_in_place() -> None:
    """The pod template of a Job is immutable: a new template gets a new name (the old Job pruned)."""
    before = job_of(render.render_children(with_trainer(), CFG))
    observed = {render_common.key(before): before}
    changed = job_of(render.render_children(with_trainer({**TRAINER, "steps": 51}), CFG))
    assert changed["metadata"]["name"] != before["metadata"]["name"]
    assert changed["metadata"]["name"].startswith("math-tool-trainer-")
    plan = diff.plan([changed], observed)
    assert [render_common.key(o) for o in plan.apply] == [render_common.key(changed)]
    assert plan.delete == (render_common.key(before),)
    suspended = job_of(render.render_children(with_trainer(suspend=True), CFG))
    assert suspended["metadata"]["name"] == before["metadata"]["name"]
    assert (suspended["spec"]["suspend"], before["spec"]["suspend"]) == (True, False)


@pytest.mark.parametrize("command", [[], ["torchrun", "my_trainer.py"]], ids=["reference", "own"])
def test_the_command_is_the_spec_s_or_the_reference_trainer(command: list[str]) -> None:
    job = with_trainer({"command": command, "args": ["--x"], "image": "me/trainer:1"})
    (c,) = job_of(render.render_children(job, CFG))["spec"]["template"]["spec"]["containers"]
    assert c["command"] == (command or ["python", "-m", "treadle.trainer.job"])
    assert c["args"] == ["--x"] and c["image"] == "me/trainer:1"
    assert render_trainer.command(job.spec.trainer) == c["command"]  # type: ignore[arg-type]


def test_the_longest_job_name_keeps_the_trainers_pods_within_63() -> None:
    job = with_trainer()
    long = job.model_copy(update={"metadata": {**job.metadata, "name": "j" * v1alpha1.MAX_JOB_NAME}})
    name = job_of(render.render_children(long, CFG))["metadata"]["name"]
    assert len(name) + 6 <= 63  # the Job controller names pods <job>-<5 characters>
