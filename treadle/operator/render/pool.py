"""One inference pool: vLLM plus the Treadle agent sidecar, and where the engine finds its weights."""

from __future__ import annotations

from typing import Any

from treadle.api import base, env_vars, nodes, v1alpha1
from treadle.operator import config
from treadle.operator.render import common

LOCAL_WEIGHTS_DIR = "/var/lib/treadle/weights"


def local_weights(job: v1alpha1.RolloutJob) -> tuple[dict[str, Any], dict[str, Any]]:
    """The volume and mount of ``weights.store: local``: only the job's own directory of the node's
    store (``<dir>/<namespace>/<job>``, above its weights prefix), at the same path in the container, so the
    store's root stays ``LOCAL_WEIGHTS_DIR`` and no job can read or overwrite another's versions."""
    path = f"{LOCAL_WEIGHTS_DIR}/{job.namespace}/{job.name}"
    return (
        {"name": "weights", "hostPath": {"path": path, "type": "DirectoryOrCreate"}},
        {"name": "weights", "mountPath": path},
    )


"""The node's directory a ``weights.store: local`` job publishes to and its engines read from."""
AGENT_STATE_DIR = "/var/run/treadle"
"""The inference pod's ``emptyDir`` where its agent keeps what it serves (lives as long as the pod)."""


def engine_resources(resources: base.Resources | None, gpus: int) -> base.Resources:
    """The engine container's CPU and memory: as the pool's ``engine.resources`` says, else scaled to
    its GPUs (vLLM's tokenizer and scheduler threads, pinned host buffers for weight swaps)."""
    if resources is not None:
        return resources
    return base.Resources(
        requests=base.ResourceList(cpu=str(4 * gpus), memory=f"{32 * gpus}Gi"),
        limits=base.ResourceList(memory=f"{64 * gpus}Gi"),
    )


def weights_env(
    job: v1alpha1.RolloutJob, cfg: config.OperatorConfig, agent: v1alpha1.Agent
) -> list[dict[str, Any]]:
    """Where the engine's weights extension pulls published versions (``weights.loader.store_from_env``),
    and where the job's trainer publishes them (``treadle.operator.render.trainer``).

    The prefix is the job's (``common.job_prefix``, its uid included: a job re-created under a
    deleted one's name never meets the versions it left); a multi-agent job's agents publish under
    ``<prefix>/<agent>`` (``weights.layout.agent_prefix``), and the engine starts on its pool's agent's.
    """
    env = {env_vars.WEIGHTS_PREFIX: common.prefix_of(job)}
    if len(job.spec.agents) > 1:
        env[env_vars.WEIGHTS_AGENT] = agent.name
    if job.spec.weights.store == "mooncake":
        env[env_vars.WEIGHTS_MASTER] = cfg.mooncake_master
        env[env_vars.WEIGHTS_METADATA] = cfg.mooncake_metadata_url
    else:
        env[env_vars.WEIGHTS_DIR] = LOCAL_WEIGHTS_DIR
    return [{"name": k, "value": v} for k, v in env.items()]


def render_pool(
    job: v1alpha1.RolloutJob, cfg: config.OperatorConfig, pool: v1alpha1.Pool
) -> list[dict[str, Any]]:
    """One inference pool: vLLM (``nvidia.com/gpu`` = TP) plus the Treadle agent sidecar."""
    agent = next(a for a in job.spec.agents if a.name == pool.agent)
    tp = pool.tensor_parallel_size
    engine = common.process(job, "vllm", pool.name)
    vllm_port = engine.port
    vllm = {
        "name": "vllm",
        "image": agent.image,
        "imagePullPolicy": cfg.image_pull_policy,
        "command": ["python", "-m", engine.module],
        "args": ["--host", "0.0.0.0", "--port", str(vllm_port), *engine.args],
        # The pool's own variables first: of a repeated name the last wins, so Treadle's stay.
        "env": [
            *(e.model_dump() for e in pool.engine.env),
            {"name": "VLLM_SERVER_DEV_MODE", "value": "1"},
            *common.pod_env(job, cfg, engine),
            *weights_env(job, cfg, agent),
        ],
        "ports": [{"name": "openai", "containerPort": vllm_port, "protocol": "TCP"}],
        "resources": engine_resources(pool.engine.resources, tp).rendered(**{nodes.GPU_RESOURCE: str(tp)}),
        # Loading a large model takes minutes: the startup probe covers it, not liveness.
        "startupProbe": {
            "httpGet": {"path": "/health", "port": vllm_port},
            "periodSeconds": 10,
            "failureThreshold": 90,
        },
        "readinessProbe": {"httpGet": {"path": "/health", "port": vllm_port}, "periodSeconds": 5},
        # After startup: an engine whose /health fails for a minute (its engine core died) is restarted.
        "livenessProbe": {
            "httpGet": {"path": "/health", "port": vllm_port},
            "periodSeconds": 10,
            "failureThreshold": 6,
        },
        "volumeMounts": [
            common.config_mount(),
            {"name": "dshm", "mountPath": "/dev/shm"},
            *([local_weights(job)[1]] if job.spec.weights.store == "local" else []),
        ],
    }
    # The engine beside the agent (one pod, one network) and the pod's own state directory.
    sidecar = common.service_container(
        job,
        cfg,
        common.process(job, "agent", pool.name),
        extra_env={
            env_vars.ENGINE_URL: f"http://127.0.0.1:{vllm_port}",
            env_vars.AGENT_STATE: f"{AGENT_STATE_DIR}/agent.json",
        },
    )
    sidecar["volumeMounts"].append({"name": "agent-state", "mountPath": AGENT_STATE_DIR})
    # vLLM runs as its image's user (root in vLLM's official image, with no capability): the pod meets
    # Pod Security "baseline"; the agent beside it, from the services image, "restricted".
    sidecar["securityContext"] = {**common.CONTAINER_SECURITY, **common.NON_ROOT}
    pod = {
        "containers": [vllm, sidecar],
        "nodeSelector": {**pool.node_selector, nodes.ACCELERATOR_LABEL: pool.accelerator},
        "tolerations": [
            {"key": nodes.GPU_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"},
            *(t.model_dump(exclude_none=True) for t in pool.tolerations),
        ],
        "terminationGracePeriodSeconds": 60,
    }
    deployment = common.deployment(
        job, cfg, "pool", replicas=engine.replicas, pod_spec=pod, pool=pool.name, max_surge=0, non_root=False
    )
    # TP > 1 shares tensors through /dev/shm (NCCL); the container default of 64 MiB is too small.
    deployment["spec"]["template"]["spec"]["volumes"].append(
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{8 * tp}Gi"}}
    )
    # The agent keeps what a move made this worker serve across its own restarts (agent.served).
    deployment["spec"]["template"]["spec"]["volumes"].append({"name": "agent-state", "emptyDir": {}})
    if job.spec.weights.store == "local":
        deployment["spec"]["template"]["spec"]["volumes"].append(local_weights(job)[0])
    deployment = common.stamp(deployment)
    ports = {"agent": config.PORTS["agent"], "openai": vllm_port}
    return [deployment, common.service(job, cfg, "pool", ports, pool=pool.name, headless=True)]
