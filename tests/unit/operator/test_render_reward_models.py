"""A job with reward models renders a reward gateway that holds their GPUs and their host-memory
backups, and its job file gives the gateway the models (``jobconfig.RewardConfig``)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from treadle import errors
from treadle.api import jobconfig, nodes, v1alpha1
from treadle.operator import config, render
from treadle.operator.render import common as render_common

CFG = config.OperatorConfig()


def job() -> v1alpha1.RolloutJob:
    return v1alpha1.parse_job({
        "apiVersion": v1alpha1.API_VERSION, "kind": v1alpha1.KIND,
        "metadata": {"name": "judged", "namespace": "team-a"},
        "spec": {
            "agents": [{"name": "a", "model": "m"}],
            "pools": [{"name": "p", "agent": "a", "accelerator": "H20"}],
            "tasks": [{"name": "t", "agents": ["a"], "environment": "math-tool", "reward": "judge:big"}],
            "externalResources": {
                "rewardModelGpus": 4,
                "rewardModels": [
                    {"name": "big", "model": "Qwen/Qwen2.5-7B-Instruct", "weightsGb": 15.2,
                     "parallelism": [1, 2, 4]},
                    {"name": "small", "model": "Qwen/Qwen2.5-1.5B-Instruct", "weightsGb": 3.1},
                ],
            },
        },
    })  # fmt: skip


def test_the_gateway_holds_the_reward_model_gpus_and_their_backups() -> None:
    children = {render_common.key(c): c for c in render.render_children(job(), CFG)}
    pod: dict[str, Any] = children[("Deployment", "judged-reward")]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["resources"]["limits"][nodes.GPU_RESOURCE] == "4"
    assert (
        container["resources"]["requests"]["memory"] == "19Gi"
    )  # 18.3 GB of backups = 17.04 GiB: 18, and 1 for the gateway
    assert pod["tolerations"] == [{"key": nodes.GPU_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}]
    spec = v1alpha1.parse_spec(json.loads(children[("ConfigMap", "judged-config")]["data"]["job.json"]))
    as_read = v1alpha1.RolloutJob(metadata={"name": "judged"}, spec=spec)
    reward = jobconfig.job_config(as_read, max_tokens=8, max_in_flight=8, max_concurrent_generations=8).reward
    assert [m.name for m in reward.models] == ["big", "small"] and reward.gpus == 4
    assert reward.models[0].parallelism == [1, 2, 4] and reward.gpu_memory_gb == 80.0


def test_vllm_reward_models_run_in_the_gateway_on_the_vllm_image_with_memory_backed_shm() -> None:
    raw = job().model_dump(by_alias=True, exclude_none=True)
    for m in raw["spec"]["externalResources"]["rewardModels"]:
        m["engine"] = "vllm"
    vllm_job = v1alpha1.parse_job(raw)
    children = {render_common.key(c): c for c in render.render_children(vllm_job, CFG)}
    pod: dict[str, Any] = children[("Deployment", "judged-reward")]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == v1alpha1.DEFAULT_VLLM_IMAGE
    assert container["command"][:3] == ["python", "-m", "treadle.services.reward"]
    assert container["resources"]["requests"]["memory"] == "35Gi"  # 18 of backups, 16 for 4 engines, 1
    assert {"name": "dshm", "emptyDir": {"medium": "Memory"}} in pod["volumes"]
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    assert any(v["name"] == render_common.config_volume(vllm_job)["name"] for v in pod["volumes"])
    assert "runAsNonRoot" not in pod["securityContext"]  # vLLM's image runs as root, as the pools' do
    settings = jobconfig.job_config(vllm_job, max_tokens=8, max_in_flight=8, max_concurrent_generations=8)
    # an engine's first start on a chunk is waited out as long as an inference engine's
    assert settings.scheduler.settings.reward_unavailable_s == jobconfig.WORKER_START_S


def test_reward_models_of_two_engines_are_refused_by_field() -> None:
    raw = job().model_dump(by_alias=True, exclude_none=True)
    raw["spec"]["externalResources"]["rewardModels"][0]["engine"] = "vllm"
    with pytest.raises(errors.SpecError) as info:
        v1alpha1.parse_job(raw)
    assert info.value.field == "spec.externalResources.rewardModels.engine", info.value
