"""The trainer's Job (``spec.trainer``): snapshot, what its pod carries, where it runs, how it changes;
a trainer of more than one process as a ``torchrun`` group (Indexed Job, rendezvous Service, ``PET_*``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import operator_examples
import pytest
import yaml

from treadle.api import env_vars, nodes, v1alpha1
from treadle.api import trainer as trainer_api
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


SINGLE: dict[str, Any] = {**TRAINER, "gpus": 1}
"""One pod of one rank: no torchrun, no Service (the Job as it always rendered)."""
GROUP: dict[str, Any] = {**TRAINER, "replicas": 2}
"""Two pods of two ranks each (``processesPerPod`` from ``gpus``)."""


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


def trainer_children(children: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [c for c in children if c["metadata"]["labels"][render_common.COMPONENT_LABEL] == "trainer"]


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    """Name -> literal value, or the ``valueFrom`` source."""
    return {e["name"]: e["value"] if "value" in e else e["valueFrom"] for e in container["env"]}


@pytest.mark.parametrize(
    ("snapshot", "trainer"),
    [
        ("math-tool-h20-trainer-single", SINGLE),  # one rank: the Job as it always was
        ("math-tool-h20-trainer", TRAINER),  # one pod of 2 GPUs: 2 ranks under torchrun
        ("math-tool-h20-trainer-group", GROUP),  # 2 pods x 2 ranks
    ],
)
def test_snapshot(snapshot: str, trainer: dict[str, Any]) -> None:
    """Set TREADLE_UPDATE_SNAPSHOTS=1 to rewrite after an intended change, then review the diff."""
    children = trainer_children(render.render_children(with_trainer(trainer), CFG))
    text = yaml.safe_dump_all(children, sort_keys=True)
    snap = SNAPSHOTS / f"{snapshot}.yaml"
    if os.environ.get("TREADLE_UPDATE_SNAPSHOTS") == "1":
        snap.write_text(text)
    assert snap.is_file(), f"{snap} missing: run with TREADLE_UPDATE_SNAPSHOTS=1"
    assert text == snap.read_text()


def test_no_trainer_no_job() -> None:
    assert [c for c in render.render_children(with_trainer(None), CFG) if c["kind"] == "Job"] == []


def test_the_pod_runs_the_reference_trainer_with_the_sdks_endpoints() -> None:
    job = with_trainer(SINGLE)
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
    env = env_of(pod["containers"][0])
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


# --- a trainer of more than one process: a torchrun group ------------------------------------------


def test_one_process_renders_no_group() -> None:
    """One rank (no GPU, or one): no Service, no Indexed completions, no torchrun, no PET_*."""
    for trainer in ({"steps": 3}, SINGLE, {**SINGLE, "command": ["python", "train.py"]}):
        children = trainer_children(render.render_children(with_trainer(trainer), CFG))
        assert [c["kind"] for c in children] == ["Job"], trainer
        spec = children[0]["spec"]
        assert spec["backoffLimit"] == render_trainer.BACKOFF_LIMIT
        assert not {"completionMode", "completions", "parallelism", "podReplacementPolicy"} & set(spec)
        (c,) = spec["template"]["spec"]["containers"]
        assert "torch.distributed.run" not in c["command"]
        assert not set(env_of(c)) & set(env_vars.TORCHRUN)


def test_a_group_is_an_indexed_job_of_one_completion_per_pod() -> None:
    job = with_trainer(GROUP)
    assert (job.spec.trainer.replicas, job.spec.trainer.processes, job.spec.trainer.world_size) == (2, 2, 4)  # type: ignore[union-attr]
    spec = job_of(render.render_children(job, CFG))["spec"]
    assert spec["completionMode"] == "Indexed"
    assert spec["completions"] == spec["parallelism"] == 2
    # Every container of the group restarts at once: BACKOFF_LIMIT restarts of the whole group.
    assert spec["backoffLimit"] == render_trainer.BACKOFF_LIMIT * 2
    assert spec["podReplacementPolicy"] == "Failed"
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] == "OnFailure"
    (c,) = pod["containers"]
    assert c["command"] == ["python", "-m", "torch.distributed.run", "--module", "treadle.trainer.job"]
    assert c["resources"]["limits"][nodes.GPU_RESOURCE] == "2"  # per pod: one rank per GPU


def test_the_groups_topology_is_torchruns_environment() -> None:
    job = with_trainer(GROUP)
    (c,) = job_of(render.render_children(job, CFG))["spec"]["template"]["spec"]["containers"]
    env = env_of(c)
    assert env[env_vars.TORCHRUN_NNODES] == "2"
    assert env[env_vars.TORCHRUN_NPROC_PER_NODE] == "2"
    assert env[env_vars.TORCHRUN_NODE_RANK] == {
        "fieldRef": {"fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}
    }
    assert env[env_vars.TORCHRUN_MASTER_ADDR] == "math-tool-trainer-rdzv.team-a.svc"
    assert env[env_vars.TORCHRUN_MASTER_PORT] == "29500"
    assert env[env_vars.GLOO_SOCKET_IFNAME] == "eth0"
    assert env[env_vars.SCHEDULER_ADDR] and env["HF_HOME"] == "/cache/hf"  # the SDK's, and the user's
    names = [e["name"] for e in c["env"]]
    assert len(names) == len(set(names))


def test_a_users_variable_of_the_same_name_wins() -> None:
    trainer = {**GROUP, "env": [{"name": "GLOO_SOCKET_IFNAME", "value": "ib0"}]}
    (c,) = job_of(render.render_children(with_trainer(trainer), CFG))["spec"]["template"]["spec"][
        "containers"
    ]
    assert [e for e in c["env"] if e["name"] == env_vars.GLOO_SOCKET_IFNAME] == [
        {"name": env_vars.GLOO_SOCKET_IFNAME, "value": "ib0"}
    ]


def test_a_trainer_of_the_users_own_keeps_its_command_and_gets_the_topology() -> None:
    trainer = {**GROUP, "command": ["torchrun", "my_train.py"], "image": "me/trainer:1"}
    (c,) = job_of(render.render_children(with_trainer(trainer), CFG))["spec"]["template"]["spec"][
        "containers"
    ]
    assert c["command"] == ["torchrun", "my_train.py"]
    assert set(env_vars.TORCHRUN) <= set(env_of(c))


def test_processes_per_pod_without_gpus_makes_a_group_on_cpu() -> None:
    job = with_trainer({"steps": 3, "processesPerPod": 4})
    rendered = job_of(render.render_children(job, CFG))
    (c,) = rendered["spec"]["template"]["spec"]["containers"]
    assert env_of(c)[env_vars.TORCHRUN_NPROC_PER_NODE] == "4" and env_of(c)[env_vars.TORCHRUN_NNODES] == "1"
    assert rendered["spec"]["completions"] == 1 and "tolerations" not in rendered["spec"]["template"]["spec"]


def test_the_rendezvous_service_resolves_to_pod_0_of_the_current_job() -> None:
    job = with_trainer(GROUP)
    children = render.render_children(job, CFG)
    rendered = job_of(children)
    (svc,) = [
        c for c in children if c["kind"] == "Service" and c["metadata"]["name"] == "math-tool-trainer-rdzv"
    ]
    assert svc["metadata"]["ownerReferences"] == [render_common.owner_reference(job)]
    assert svc["metadata"]["annotations"][render_common.HASH_ANNOTATION] == render_common.spec_hash(svc)
    spec = svc["spec"]
    assert spec["clusterIP"] == "None" and spec["publishNotReadyAddresses"] is True
    assert spec["ports"] == [{"name": "rdzv", "port": 29500, "targetPort": 29500, "protocol": "TCP"}]
    assert spec["selector"] == {
        **render_common.selector(job, "trainer"),
        "batch.kubernetes.io/job-name": rendered["metadata"]["name"],
        "batch.kubernetes.io/job-completion-index": "0",
    }
    # The selector picks the pods of the Job's template: the Job controller adds the other two labels.
    labels = rendered["spec"]["template"]["metadata"]["labels"]
    assert render_common.selector(job, "trainer").items() <= labels.items()
    assert render_trainer.job_name(job, CFG) == rendered["metadata"]["name"]


def test_a_group_that_becomes_one_process_prunes_its_service() -> None:
    observed = {render_common.key(c): c for c in render.render_children(with_trainer(GROUP), CFG)}
    plan = diff.plan(render.render_children(with_trainer(SINGLE), CFG), observed)
    assert ("Service", "math-tool-trainer-rdzv") in plan.delete
    assert [k for k in plan.delete if k[0] == "Job"] != []  # and the Job: a new template, a new name


def test_the_groups_shape_is_in_the_jobs_name_not_in_the_settings_digest() -> None:
    """replicas and processesPerPod reach the pods through the Job (completions, PET_*), not the job file."""
    two = job_of(render.render_children(with_trainer(GROUP), CFG))
    three = job_of(render.render_children(with_trainer({**GROUP, "replicas": 3}), CFG))
    assert two["metadata"]["name"] != three["metadata"]["name"]
    settings = render_trainer.SETTINGS_ANNOTATION
    assert (
        two["spec"]["template"]["metadata"]["annotations"][settings]
        == (three["spec"]["template"]["metadata"]["annotations"][settings])
    )


def test_the_longest_job_name_keeps_the_groups_names_within_63() -> None:
    job = with_trainer(GROUP)
    long = job.model_copy(update={"metadata": {**job.metadata, "name": "j" * v1alpha1.MAX_JOB_NAME}})
    children = trainer_children(render.render_children(long, CFG))
    name = job_of(children)["metadata"]["name"]
    # Indexed Job pods are named <job>-<index>-<5 characters> (the controller shortens <job> to fit)
    # and their hostname is <job>-<index>, a DNS label.
    assert len(f"{name}-{trainer_api.MAX_REPLICAS - 1}") <= 63
    (svc,) = [c for c in children if c["kind"] == "Service"]
    assert len(svc["metadata"]["name"]) <= 63


def test_torchrun_reads_the_rendered_variables_as_its_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    """The names are torch's: ``torch.distributed.run`` takes each flag's default from ``PET_<FLAG>``."""
    from torch.distributed import run as torchrun

    (c,) = job_of(render.render_children(with_trainer(GROUP), CFG))["spec"]["template"]["spec"]["containers"]
    for e in c["env"]:
        if e["name"].startswith("PET_"):
            monkeypatch.setenv(e["name"], e.get("value", "1"))  # the node rank comes from the pod
    args = torchrun.get_args_parser().parse_args(c["command"][3:])
    assert (args.nnodes, args.nproc_per_node, args.node_rank) == ("2", "2", 1)
    assert (args.master_addr, args.master_port) == ("math-tool-trainer-rdzv.team-a.svc", 29500)
    assert args.module and args.training_script == "treadle.trainer.job"


def test_the_dev_clusters_node_agent_resolves_the_node_rank_and_answers_for_the_rendezvous() -> None:
    """The dev cluster runs a group as Kubernetes does: the node agent resolves the annotation fieldRef
    the Job controller fills, and its DNS answers for the Service with the pod's address (the
    EndpointSlice controller marks a not-ready pod's endpoint ready when the Service publishes them)."""
    from treadle.devcluster.nodeagent import dns, inputs

    job = with_trainer(GROUP)
    children = render.render_children(job, CFG)
    (c,) = job_of(children)["spec"]["template"]["spec"]["containers"]
    (rank,) = [e for e in c["env"] if e["name"] == env_vars.TORCHRUN_NODE_RANK]
    pod = {
        "metadata": {"name": "p", "namespace": "team-a", "uid": "u",
                     "annotations": {render_trainer.COMPLETION_INDEX: "1"}},
        "spec": {},
    }  # fmt: skip
    assert inputs.field_value(pod, rank["valueFrom"]["fieldRef"]["fieldPath"]) == "1"
    (svc,) = [s for s in children if s["metadata"]["name"] == render_trainer.rendezvous_name(job)]
    endpoint_slice = {
        "metadata": {
            "namespace": "team-a",
            "labels": {"kubernetes.io/service-name": svc["metadata"]["name"]},
        },
        "addressType": "IPv4",
        "endpoints": [{"addresses": ["10.0.0.5"], "conditions": {"ready": True}}],
    }
    addr = next(e["value"] for e in c["env"] if e["name"] == env_vars.TORCHRUN_MASTER_ADDR)
    assert dns.records([svc], [endpoint_slice])[f"{addr}.{dns.DOMAIN}."] == ["10.0.0.5"]
