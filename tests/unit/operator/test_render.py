"""Renderers: snapshot per example, and the properties every child must have."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import operator_examples
import pytest
import yaml

from treadle import topology
from treadle.api import engine as engine_api
from treadle.api import nodes, v1alpha1
from treadle.operator import config, render
from treadle.operator.render import common as render_common
from treadle.operator.render import coordination as render_coordination

SNAPSHOTS = Path(__file__).parent / "snapshots"
CFG = config.OperatorConfig()


@pytest.mark.parametrize("path", operator_examples.EXAMPLES, ids=lambda p: p.stem)
def test_snapshot(path: Path) -> None:
    """Set TREADLE_UPDATE_SNAPSHOTS=1 to rewrite after an intended change, then review the diff."""
    text = yaml.safe_dump_all(
        render.render_children(operator_examples.load_example(path), CFG), sort_keys=True
    )
    snap = SNAPSHOTS / f"{path.stem}.yaml"
    if os.environ.get("TREADLE_UPDATE_SNAPSHOTS") == "1":
        snap.write_text(text)
    assert snap.is_file(), f"{snap} missing: run with TREADLE_UPDATE_SNAPSHOTS=1"
    assert text == snap.read_text(), f"{path.name} renders differently from {snap.name}"


def _pools(children: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [c for c in children if c["kind"] == "Deployment" and c["metadata"]["name"].split("-pool-")[1:]]


@pytest.mark.parametrize("path", operator_examples.EXAMPLES, ids=lambda p: p.stem)
def test_every_child_is_owned_labelled_and_hashed(path: Path) -> None:
    job = operator_examples.load_example(path)
    children = render.render_children(job, CFG)
    keys = [render_common.key(c) for c in children]
    assert len(keys) == len(set(keys)), "duplicate child"
    for child in children:
        meta = child["metadata"]
        assert meta["namespace"] == "team-a"
        assert meta["ownerReferences"] == [render_common.owner_reference(job)]
        assert meta["ownerReferences"][0]["uid"] == job.metadata["uid"]
        assert meta["labels"][render_common.JOB_LABEL] == job.name
        assert meta["annotations"][render_common.HASH_ANNOTATION] == render_common.spec_hash(child)
        assert len(meta["name"]) <= 63


@pytest.mark.parametrize("path", operator_examples.EXAMPLES, ids=lambda p: p.stem)
def test_pool_pods_target_their_accelerator_with_tp_gpus(path: Path) -> None:
    job = operator_examples.load_example(path)
    deployments = {d["metadata"]["name"]: d for d in _pools(render.render_children(job, CFG))}
    assert len(deployments) == len(job.spec.pools)
    for pool in job.spec.pools:
        d = deployments[f"{job.name}-pool-{pool.name}"]
        pod = d["spec"]["template"]["spec"]
        assert d["spec"]["replicas"] == pool.replicas
        assert pod["nodeSelector"][nodes.ACCELERATOR_LABEL] == pool.accelerator
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
        vllm, agent = pod["containers"]
        assert vllm["resources"]["limits"]["nvidia.com/gpu"] == str(pool.tensor_parallel_size)
        assert vllm["command"] == ["python", "-m", "vllm.entrypoints.openai.api_server"]
        assert vllm["args"][vllm["args"].index("--tensor-parallel-size") + 1] == str(
            pool.tensor_parallel_size
        )
        assert agent["command"][:3] == ["python", "-m", "treadle.services.agent"]
        assert "nvidia.com/gpu" not in agent["resources"].get("limits", {})
        assert d["spec"]["selector"]["matchLabels"] == render_common.selector(job, "pool", pool.name)


def test_services_run_their_module_on_the_fixed_port(math_job: v1alpha1.RolloutJob) -> None:
    children = {render_common.key(c): c for c in render.render_children(math_job, CFG)}
    for component in ("scheduler", "placement", "buffer", "env", "reward"):
        d = children[("Deployment", f"math-tool-{component}")]
        (container,) = d["spec"]["template"]["spec"]["containers"]
        port = str(config.PORTS[component])
        module = config.MODULES[component]
        assert container["command"] == ["python", "-m", module, "--host", "0.0.0.0", "--port", port]
        svc = children[("Service", f"math-tool-{component}")]
        assert svc["spec"]["ports"][0]["port"] == config.PORTS[component]


def test_suspend_scales_every_deployment_to_zero(math_job: v1alpha1.RolloutJob) -> None:
    suspended = math_job.model_copy(update={"spec": math_job.spec.model_copy(update={"suspend": True})})
    for child in render.render_children(suspended, CFG):
        if child["kind"] == "Deployment":
            assert child["spec"]["replicas"] == 0, child["metadata"]["name"]


def test_changing_one_pool_changes_only_that_pool_and_the_config(math_job: v1alpha1.RolloutJob) -> None:
    before = {render_common.key(c): c for c in render.render_children(math_job, CFG)}
    pool = math_job.spec.pools[0].model_copy(update={"replicas": 7})
    job = math_job.model_copy(update={"spec": math_job.spec.model_copy(update={"pools": [pool]})})
    after = {render_common.key(c): c for c in render.render_children(job, CFG)}
    changed = sorted(
        k for k in after if render_common.spec_hash(after[k]) != render_common.spec_hash(before[k])
    )
    assert changed == [("ConfigMap", "math-tool-config"), ("Deployment", "math-tool-pool-decode")]


@pytest.mark.parametrize(
    ("demand", "scale_to_zero", "min_replicas", "expected"),
    [
        (None, True, 0, 0),  # idle, scale to zero
        ("0", True, 0, 0),  # explicit idle
        ("1", True, 0, 1),  # any demand wakes one replica
        ("65", True, 0, 2),  # 32 requests per replica, capped by maxReplicas=2
        ("1000", True, 0, 2),  # never above maxReplicas
        (None, False, 0, 1),  # without scale to zero one replica stays
        ("garbage", True, 0, 0),  # a malformed annotation counts as no demand
    ],
)
def test_reward_replicas_follow_demand(
    math_job: v1alpha1.RolloutJob, demand: str | None, scale_to_zero: bool, min_replicas: int, expected: int
) -> None:
    reward = math_job.spec.reward.model_copy(
        update={"scale_to_zero": scale_to_zero, "min_replicas": min_replicas}
    )
    annotations = {} if demand is None else {v1alpha1.REWARD_DEMAND_ANNOTATION: demand}
    job = math_job.model_copy(
        update={
            "spec": math_job.spec.model_copy(update={"reward": reward}),
            "metadata": math_job.metadata | {"annotations": annotations},
        }
    )
    assert topology.reward_replicas(job) == expected


def test_local_weights_render_no_store(math_job: v1alpha1.RolloutJob) -> None:
    weights = v1alpha1.Weights(store="local", replicas=1)
    job = math_job.model_copy(update={"spec": math_job.spec.model_copy(update={"weights": weights})})
    names = [c["metadata"]["name"] for c in render.render_children(job, CFG)]
    assert "math-tool-weights" not in names
    assert "math-tool-weights" in [c["metadata"]["name"] for c in render.render_children(math_job, CFG)]


def test_config_map_carries_spec_and_endpoints(math_job: v1alpha1.RolloutJob) -> None:
    cm = render_coordination.render_config(math_job, CFG)
    spec = v1alpha1.parse_spec(yaml.safe_load(cm["data"]["job.json"]))
    assert spec == math_job.spec
    endpoints = yaml.safe_load(cm["data"]["endpoints.json"])
    assert endpoints["scheduler"] == "math-tool-scheduler.team-a.svc:50051"
    assert endpoints["pools"]["decode"]["accelerator"] == "H20"


def test_only_the_reward_gateway_takes_a_cluster_ip(math_job: v1alpha1.RolloutJob) -> None:
    services = [c for c in render.render_children(math_job, CFG) if c["kind"] == "Service"]
    with_ip = [s["metadata"]["name"] for s in services if s["spec"].get("clusterIP") != "None"]
    assert with_ip == ["math-tool-reward"]


def test_pool_engine_overrides_extend_vllm_and_keep_treadles_variables(math_job: v1alpha1.RolloutJob) -> None:
    """``spec.pools[].engine``: vLLM's CPU build on the dev cluster takes flags, variables and requests
    the GPU defaults lack; a variable Treadle sets keeps Treadle's value (the last of a name wins)."""
    engine = engine_api.Engine(
        args=["--enforce-eager", "--dtype", "float32"],
        env=[engine_api.EnvVar(name="VLLM_CPU_KVCACHE_SPACE", value="1"),
             engine_api.EnvVar(name="VLLM_SERVER_DEV_MODE", value="0")],
        resources={"requests": {"cpu": "1", "memory": "4Gi"}, "limits": {"memory": "4Gi"}},
    )  # fmt: skip
    pools = [math_job.spec.pools[0].model_copy(update={"engine": engine})]
    job = math_job.model_copy(update={"spec": math_job.spec.model_copy(update={"pools": pools})})
    vllm = _pools(render.render_children(job, CFG))[0]["spec"]["template"]["spec"]["containers"][0]
    assert vllm["args"][-3:] == ["--enforce-eager", "--dtype", "float32"]
    env = {e["name"]: e.get("value") for e in vllm["env"]}  # the last of a repeated name, as the kubelet
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1" and env["VLLM_SERVER_DEV_MODE"] == "1"
    assert vllm["resources"] == {  # as written, the pool's GPUs added to both lists
        "requests": {"cpu": "1", "memory": "4Gi", nodes.GPU_RESOURCE: "2"},
        "limits": {"memory": "4Gi", nodes.GPU_RESOURCE: "2"},
    }
    default = _pools(render.render_children(math_job, CFG))[0]["spec"]["template"]["spec"]["containers"][0]
    assert default["resources"] == {  # unset: scaled to the pool's 2 GPUs
        "requests": {"cpu": "8", "memory": "64Gi", nodes.GPU_RESOURCE: "2"},
        "limits": {"memory": "128Gi", nodes.GPU_RESOURCE: "2"},
    }
    assert "--enforce-eager" not in default["args"]


def test_the_dev_clusters_learning_job_renders_vllm_for_its_cpu_build() -> None:
    """``manifests/dev/learn.yaml`` (e2e/learn runs it): float32, eager, the CPU KV cache, a trainer Job,
    a feeder, and small requests that fit the dev cluster's process nodes."""
    job = operator_examples.load_example(operator_examples.ROOT / "manifests" / "dev" / "learn.yaml")
    children = render.render_children(job, CFG)
    vllm = _pools(children)[0]["spec"]["template"]["spec"]["containers"][0]
    assert vllm["args"][vllm["args"].index("--dtype") + 1] == "float32" and "--enforce-eager" in vllm["args"]
    assert {"name": "VLLM_CPU_KVCACHE_SPACE", "value": "1"} in vllm["env"]
    assert vllm["resources"]["requests"]["cpu"] == "1"
    assert {"Job", "Deployment"} <= {c["kind"] for c in children}
    assert any(c["metadata"]["name"] == "learn-feeder" for c in children)
