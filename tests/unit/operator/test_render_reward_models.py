"""A job with reward models renders a reward gateway that holds their GPUs and their host-memory
backups, and its job file gives the gateway the models (``jobconfig.RewardConfig``)."""

from __future__ import annotations

import json
from typing import Any

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
