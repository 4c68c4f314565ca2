"""The feeder a dataset job renders (its volumes, probes, one racing-free replica) and where CPU pods land."""

from __future__ import annotations

from typing import Any

import operator_examples
import pytest

from treadle import errors
from treadle.api import dataset as dataset_api
from treadle.api import nodes, v1alpha1
from treadle.operator import config, reasons, render, status
from treadle.operator.render import common as render_common

CFG = config.OperatorConfig()
CPU_COMPONENTS = ("scheduler", "placement", "buffer", "env", "reward", "feeder")


def _job(**spec: Any) -> v1alpha1.RolloutJob:
    """One agent, two dataset tasks (a ConfigMap key and a file on a PVC) and a Hugging Face one."""
    base: dict[str, Any] = {
        "agents": [{"name": "a", "model": "m"}],
        "pools": [{"name": "p", "agent": "a", "accelerator": "H20"}],
        "tasks": [
            {"name": "cm", "agents": ["a"], "environment": "math-tool", "reward": "math",
             "dataset": {"source": {"configMap": {"name": "rows", "key": "math.jsonl"}}}},
            {"name": "pvc", "agents": ["a"], "environment": "math-tool", "reward": "math",
             "dataset": {"source": {"path": "/data/gsm8k/train.parquet"}}},
            {"name": "hf", "agents": ["a"], "environment": "math-tool", "reward": "math",
             "dataset": {"source": {"huggingFace": {"name": "openai/gsm8k", "config": "main"}}}},
            {"name": "seeds", "agents": ["a"], "environment": "frozenlake", "reward": "env"},
        ],
        "feeder": {
            "volumes": [
                {"name": "datasets", "mountPath": "/data",
                 "persistentVolumeClaim": {"claimName": "datasets"}},
                {"name": "hf", "mountPath": "/cache", "hostPath": {"path": "/var/lib/hf"}},
            ],
            "huggingFaceCache": "/cache/hub",
            "resources": {"requests": {"cpu": "500m", "memory": "6Gi"}, "limits": {"memory": "6Gi"}},
        },
    }  # fmt: skip
    return v1alpha1.parse_job({
        "apiVersion": v1alpha1.API_VERSION, "kind": v1alpha1.KIND,
        "metadata": {"name": "fed", "namespace": "team-a", "uid": "u1"}, "spec": base | spec,
    })  # fmt: skip


def _children(job: v1alpha1.RolloutJob) -> dict[tuple[str, str], dict[str, Any]]:
    return {render_common.key(c): c for c in render.render_children(job, CFG)}


def _pod(children: dict[tuple[str, str], dict[str, Any]], name: str) -> dict[str, Any]:
    pod: dict[str, Any] = children[("Deployment", name)]["spec"]["template"]["spec"]
    return pod


def test_a_job_without_datasets_gets_a_feeder_of_its_environments_seeds() -> None:
    """Nothing else submits a task without a dataset in a cluster: before the feeder fed seeds, the
    examples applied, reconciled and sat at STEP 0 for ever."""
    job = operator_examples.load_example(operator_examples.ROOT / "manifests/examples/math-tool-h20.yaml")
    children = _children(job)
    assert ("Deployment", "math-tool-feeder") in children
    assert render.expected_replicas(job)["math-tool-feeder"] == 1
    pod = _pod(children, "math-tool-feeder")
    assert not [v for v in pod.get("volumes", []) if "configMap" in v and v["name"].startswith("dataset")]


def test_the_feeder_is_one_recreated_pod_mounting_every_source() -> None:
    job = _job()
    children = _children(job)
    deployment = children[("Deployment", "fed-feeder")]
    assert deployment["spec"]["replicas"] == 1 and render.expected_replicas(job)["fed-feeder"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}  # two feeders never race on a position
    pod = _pod(children, "fed-feeder")
    (c,) = pod["containers"]
    assert c["image"] == CFG.services_image
    assert c["command"][:3] == ["python", "-m", "treadle.services.feeder"]
    assert c["ports"] == [
        {"name": "http", "containerPort": config.PORTS["feeder"], "protocol": "TCP"},
        {"name": "metrics", "containerPort": config.PORTS["metrics"], "protocol": "TCP"},
    ]
    assert c["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": config.PORTS["feeder"]}
    assert c["livenessProbe"]["tcpSocket"] == {"port": config.PORTS["feeder"]}
    assert c["resources"] == {"requests": {"cpu": "500m", "memory": "6Gi"}, "limits": {"memory": "6Gi"}}
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: volumes[m["name"]] for m in c["volumeMounts"]}
    assert all(m["readOnly"] for m in c["volumeMounts"])
    # The ConfigMap key is the file the reader opens (dataset.config_map_path).
    cm_task = job.spec.tasks[0].dataset
    assert cm_task is not None and cm_task.source.config_map is not None
    cm_file = dataset_api.config_map_path(cm_task.source.config_map)
    assert mounts[str(cm_file.parent)]["configMap"] == {"name": "rows"}
    assert cm_file.parent == dataset_api.CONFIG_MAP_MOUNT / "rows"
    assert mounts["/data"]["persistentVolumeClaim"] == {"claimName": "datasets", "readOnly": True}
    assert mounts["/cache"]["hostPath"] == {"path": "/var/lib/hf", "type": "Directory"}
    assert mounts[render_common.CONFIG_MOUNT]["configMap"]["name"] == "fed-config"
    service = children[("Service", "fed-feeder")]
    assert service["spec"]["ports"][0]["name"] == "http" and service["spec"]["clusterIP"] == "None"


def test_the_feeder_counts_toward_readiness() -> None:
    job = _job()
    deployments = {
        name: status.DeploymentState(desired=n, ready=n, updated=n, current=True)
        for name, n in render.expected_replicas(job).items()
    }
    gpus = {"H20": 8}
    st, _ = status.compute(job, status.Observed(deployments=deployments, gpu_capacity=gpus), now="t")
    assert st.phase == "Ready"
    deployments["fed-feeder"] = status.DeploymentState(desired=1, ready=0, updated=1, current=True)
    st, _ = status.compute(job, status.Observed(deployments=deployments, gpu_capacity=gpus), now="t")
    assert st.phase == "Progressing" and "feeder 0/1 ready" in st.conditions[0].message


@pytest.mark.parametrize(
    ("feeder", "field"),
    [
        ({"volumes": [{"name": "d", "mountPath": "/elsewhere", "hostPath": {"path": "/x"}}]},
         "spec.tasks.dataset.source.path"),
        ({"volumes": [{"name": "d", "mountPath": "/data/gsm8k/train.parquet", "hostPath": {"path": "/x"}}]},
         "spec.tasks.dataset.source.path"),
        ({"volumes": [{"name": "d", "mountPath": "/data", "hostPath": {"path": "/x"},
                       "persistentVolumeClaim": {"claimName": "c"}}]}, "spec.feeder.volumes"),
        ({"volumes": [{"name": "d", "mountPath": "/data"}]}, "spec.feeder.volumes"),
        ({"volumes": [{"name": "d", "mountPath": "/data", "hostPath": {"path": "/x"}}],
          "huggingFaceCache": "/cache"}, "spec.feeder.huggingFaceCache"),
        ({"volumes": [{"name": "d", "mountPath": "/data/..", "hostPath": {"path": "/x"}}]},
         "spec.feeder.volumes"),
        ({"volumes": [{"name": "d", "mountPath": "/data", "hostPath": {"path": "/x"}},
                      {"name": "d", "mountPath": "/more", "hostPath": {"path": "/y"}}]},
         "spec.feeder.volumes"),
        ({"volumes": [{"name": "d", "mountPath": "/data", "hostPath": {"path": "/x"}},
                      {"name": "e", "mountPath": "/etc/treadle-datasets", "hostPath": {"path": "/y"}}]},
         "spec.feeder.volumes"),
    ],
    ids=["outside", "the-mount-itself", "two-sources", "no-source", "hf-cache-outside", "dots", "same-name",
         "over-the-config"],
)  # fmt: skip
def test_a_dataset_path_must_lie_under_a_declared_volume(feeder: dict[str, Any], field: str) -> None:
    with pytest.raises(errors.SpecError) as info:
        _job(feeder=feeder)
    assert info.value.field.startswith(field), info.value


def test_a_path_escaping_its_volume_is_refused() -> None:
    tasks = [{"name": "t", "agents": ["a"], "environment": "math-tool", "reward": "math",
              "dataset": {"source": {"path": "/data/../etc/passwd"}}}]  # fmt: skip
    feeder = {"volumes": [{"name": "d", "mountPath": "/data", "hostPath": {"path": "/x"}}]}
    with pytest.raises(errors.SpecError) as info:
        _job(tasks=tasks, feeder=feeder)
    assert info.value.field == "spec.tasks.dataset.source.path"


def _gpu_free(pod: dict[str, Any]) -> bool:
    """Whether the pod's required node affinity excludes every GPU class and GPU-operator node."""
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    (term,) = terms["nodeSelectorTerms"]
    exprs = {e["key"]: e for e in term["matchExpressions"]}
    return exprs[nodes.GPU_PRESENT_LABEL]["operator"] == "DoesNotExist" and set(
        exprs[nodes.ACCELERATOR_LABEL]["values"]
    ) == {"H800", "H20", "H100", "H200", "A100"}


def test_cpu_pods_avoid_gpu_nodes_without_needing_a_label_on_cpu_nodes() -> None:
    children = _children(_job())
    for component in CPU_COMPONENTS:
        pod = _pod(children, f"fed-{component}")
        assert _gpu_free(pod), component
        assert "nodeSelector" not in pod and "tolerations" not in pod, component
    pool = _pod(children, "fed-pool-p")
    assert "affinity" not in pool and pool["nodeSelector"][nodes.ACCELERATOR_LABEL] == "H20"


def test_cpu_placement_is_overridable_in_the_spec() -> None:
    toleration = {"key": "dedicated", "operator": "Equal", "value": "rl", "effect": "NoSchedule"}
    cpu = {"nodeSelector": {"pool": "cpu-big"}, "tolerations": [toleration]}
    children = _children(_job(placement={"cpu": cpu}))
    for component in CPU_COMPONENTS:
        pod = _pod(children, f"fed-{component}")
        assert pod["nodeSelector"] == {"pool": "cpu-big"} and pod["tolerations"] == [toleration]
        assert _gpu_free(pod)
    anywhere = _children(_job(placement={"cpu": {"avoidGpuNodes": False}}))
    for component in CPU_COMPONENTS:
        assert not {"affinity", "nodeSelector", "tolerations"} & set(_pod(anywhere, f"fed-{component}"))


def test_a_judge_with_gpus_is_no_cpu_pod() -> None:
    reward = {"type": "llm-judge", "judgeModel": "j"}
    children = _children(_job(reward=reward, externalResources={"rewardModelGpus": 1}))
    pod = _pod(children, "fed-reward")
    assert "affinity" not in pod
    assert pod["tolerations"] == [{"key": nodes.GPU_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}]


def test_the_feeder_may_patch_its_own_job_and_nothing_else() -> None:
    children = _children(_job())
    (rule,) = children[("Role", "fed-feeder")]["rules"]
    assert rule == {"apiGroups": [v1alpha1.GROUP], "resources": [v1alpha1.PLURAL], "resourceNames": ["fed"],
                    "verbs": ["patch"]}  # fmt: skip
    binding = children[("RoleBinding", "fed-feeder")]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "fed-feeder", "namespace": "team-a"}]
    assert binding["roleRef"]["name"] == "fed-feeder" and ("ServiceAccount", "fed-feeder") in children
    pod = _pod(children, "fed-feeder")
    assert (pod["serviceAccountName"], pod["automountServiceAccountToken"]) == ("fed-feeder", True)
    order = [render_common.key(c) for c in render.render_children(_job(), CFG)]
    assert order.index(("ServiceAccount", "fed-feeder")) < order.index(("Deployment", "fed-feeder"))
    for component in ("env", "reward", "placement", "buffer"):
        assert _pod(children, f"fed-{component}")["automountServiceAccountToken"] is False, component


def _observed(job: v1alpha1.RolloutJob) -> status.Observed:
    deployments = {
        name: status.DeploymentState(desired=n, ready=n, updated=n, current=True)
        for name, n in render.expected_replicas(job).items()
    }
    if "fed-feeder" in deployments:  # not ready while it cannot read a dataset
        deployments["fed-feeder"] = status.DeploymentState(desired=1, ready=0, updated=1, current=True)
    return status.Observed(deployments=deployments, gpu_capacity={"H20": 8})


def test_what_the_feeder_says_on_the_job_makes_it_degraded_naming_the_dataset() -> None:
    said = "spec.tasks[1].dataset.source.path: cannot read /data/gsm8k/train.parquet: No such file"
    job = _job().model_copy(update={"metadata": {
        **_job().metadata, "annotations": {v1alpha1.FEEDER_PROBLEM_ANNOTATION: said}}})  # fmt: skip
    st, transitions = status.compute(job, _observed(job), now="t")
    degraded = next(c for c in st.conditions if c.type == "Degraded")
    assert (st.phase, degraded.status, degraded.reason) == ("Degraded", "True", reasons.DATASET_UNUSABLE)
    assert degraded.message == f"feeder: {said}"
    ready = next(c for c in st.conditions if c.type == "Ready")
    assert ready.reason == reasons.DATASET_UNUSABLE and "feeder 0/1 ready" in ready.message
    assert any(t.type == "Degraded" and t.event_type == "Warning" for t in transitions)
    # Taken back (the feeder read every dataset): no longer degraded.
    fixed = job.model_copy(update={"metadata": _job().metadata})
    st, _ = status.compute(fixed, _observed(fixed), now="t")
    assert next(c for c in st.conditions if c.type == "Degraded").status == "False"


def test_a_feeder_problem_degrades_a_job_whatever_its_tasks_read() -> None:
    job = operator_examples.load_example(
        operator_examples.ROOT / "manifests/examples/math-tool-h20.yaml",
        annotations={v1alpha1.FEEDER_PROBLEM_ANNOTATION: "spec.tasks[0].dataset: gone"},
    )
    deployments = {
        name: status.DeploymentState(desired=n, ready=n, updated=n, current=True)
        for name, n in render.expected_replicas(job).items()
    }
    st, _ = status.compute(job, status.Observed(deployments=deployments, gpu_capacity={"H20": 8}), now="t")
    assert st.phase == "Degraded"
