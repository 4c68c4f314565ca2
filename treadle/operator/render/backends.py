"""The job's shared backends: the weight store, the environment pool and the reward gateway."""

from __future__ import annotations

import math
from typing import Any

from treadle.api import nodes, v1alpha1
from treadle.operator import config
from treadle.operator.render import common


def render_weights(job: v1alpha1.RolloutJob, cfg: config.OperatorConfig) -> list[dict[str, Any]]:
    """Mooncake store processes holding published weights (``weights.replicas`` copies); none for local."""
    if job.spec.weights.store != "mooncake":
        return []
    proc = common.process(job, "weights")
    container = common.service_container(
        job,
        cfg,
        proc,
        resources={"requests": {"cpu": "1", "memory": "8Gi"}, "limits": {"memory": "64Gi"}},
        extra_env={"MC_TCP_BIND_ADDRESS": "0.0.0.0"},
    )
    # Spread the copies: two replicas on one node would lose both with it.
    spread = {
        "topologySpreadConstraints": [
            {
                "maxSkew": 1,
                "topologyKey": "kubernetes.io/hostname",
                "whenUnsatisfiable": "ScheduleAnyway",
                "labelSelector": {"matchLabels": common.selector(job, "weights")},
            }
        ]
    }
    deployment = common.deployment(
        job,
        cfg,
        "weights",
        replicas=proc.replicas,
        pod_spec={"containers": [container], **spread},
    )
    # Headless: clients address each store process (each holds its own segment), not a balancer.
    return [deployment, common.service(job, cfg, "weights", {"grpc": config.PORTS["weights"]}, headless=True)]


def render_environment(job: v1alpha1.RolloutJob, cfg: config.OperatorConfig) -> list[dict[str, Any]]:
    """The CPU environment pool: sandboxed sessions, one container per pod (RollArt §3.1 isolation)."""
    env = job.spec.environment
    proc = common.process(job, "env")
    container = common.service_container(job, cfg, proc, image=env.image, resources=env.resources.rendered())
    pod = {"containers": [container], **common.cpu_placement(job)}
    deployment = common.deployment(job, cfg, "env", replicas=proc.replicas, pod_spec=pod)
    # Headless: an environment session lives in one pod's memory, so the scheduler must open and
    # step it on the same pod; DNS lists every pod and a balancer would scatter the steps.
    return [deployment, common.service(job, cfg, "env", {"http": config.PORTS["env"]}, headless=True)]


def render_reward(job: v1alpha1.RolloutJob, cfg: config.OperatorConfig) -> list[dict[str, Any]]:
    """The reward gateway; its replicas follow ``topology.reward_replicas``."""
    reward = job.spec.reward
    res = job.spec.external_resources
    vllm = any(m.engine == "vllm" for m in res.reward_models)
    # vLLM reward models run as processes of the gateway's container: its image holds vLLM and Treadle.
    proc = common.process(job, "reward")
    container = common.service_container(job, cfg, proc, image=res.reward_model_image if vllm else None)
    pod: dict[str, Any] = {"containers": [container]}
    if res.reward_model_gpus > 0 and (reward.type == "llm-judge" or res.reward_models):
        # Judge and reward models run on GPUs of their own (any class), as RollArt's reward LLM does;
        # the gateway keeps every reward model's weights in host memory to restore them (ARL-Tangram).
        backups_gi = math.ceil(sum(m.weights_gb for m in res.reward_models) * 1e9 / 2**30)
        # vLLM engines: each engine process's own host memory beside the backups (ours: 4 Gi a GPU).
        engines_gi = 4 * res.reward_model_gpus if vllm else 0
        container["resources"] = {  # the backups, plus room for the gateway and a restore in flight
            "limits": {
                nodes.GPU_RESOURCE: str(res.reward_model_gpus),
                "memory": f"{backups_gi + engines_gi + 4}Gi",
            },
            "requests": {"cpu": "2", "memory": f"{backups_gi + engines_gi + 1}Gi"},
        }
        pod["tolerations"] = [{"key": nodes.GPU_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}]
        if vllm:  # the backups (engines.BACKUP_DIR) live in host memory; vLLM's workers share tensors there
            pod["volumes"] = [common.config_volume(job), {"name": "dshm", "emptyDir": {"medium": "Memory"}}]
            container["volumeMounts"].append({"name": "dshm", "mountPath": "/dev/shm"})
    else:
        pod |= common.cpu_placement(job)
    # vLLM's image runs as root (as the inference pods' do): the pod then meets Pod Security "baseline".
    deployment = common.deployment(
        job, cfg, "reward", replicas=proc.replicas, pod_spec=pod, non_root=not vllm
    )
    return [deployment, common.service(job, cfg, "reward", {"http": config.PORTS["reward"]})]
