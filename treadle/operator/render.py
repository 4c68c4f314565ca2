"""Pure renderers: RolloutJob (+ operator config) -> the Kubernetes objects it owns.

Called by ``treadle.operator.reconcile`` (which diffs and applies what these return) and by the
snapshot tests. No I/O, no clock: the same job and config always render byte-identical objects,
and each object carries a hash of itself so the reconciler re-applies only what changed.

Children of job ``J`` (all in J's namespace, owned by J through a controller ownerReference, so
the garbage collector deletes them with J even while the operator is down):

- ``J-config`` ConfigMap: the validated spec and the endpoint map every component reads.
- ``J-scheduler``, ``J-placement``, ``J-buffer`` Deployments + Services: per-job coordination.
- ``J-scheduler`` ServiceAccount + Role + RoleBinding: the one pod that talks to the API server
  (it reports reward demand on the job), allowed to ``patch`` this one RolloutJob and nothing
  else. Every other pod runs without a ServiceAccount token.
- ``J-weights`` Deployment + Service (Mooncake store processes; only for ``weights.store: mooncake``).
- ``J-env`` Deployment + Service: CPU environment pods.
- ``J-reward`` Deployment + Service: the reward gateway, 0 replicas when idle and scale-to-zero.
  It is the only ClusterIP Service (stateless, idempotent scoring behind a balancer); the others
  are headless: singletons, stateful env sessions and per-replica inference/store addresses.
- ``J-pool-P`` Deployment + headless Service per inference pool: vLLM + the agent sidecar.

Per-job coordination services, not shared ones: the scheduler, placement and buffer hold per-job
state (staleness window, policy version, sticky worker map, group bookkeeping) and per-job policy
choices (``rollout.schedulingPolicy``/``placementPolicy``); one process per job keeps a crash or a
restart inside one job, lets a job be suspended or deleted by scaling or garbage-collecting its
own pods, and needs no registration protocol or multi-tenant authorization inside the services.
Only the stateful backends are shared and installed by the chart: Redis (the experience store,
keys prefixed ``<namespace>/<job>``) and the Mooncake master (object keys prefixed the same way).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from typing import Any

from treadle.api import env_vars, nodes, v1alpha1
from treadle.operator import config

HASH_ANNOTATION = "treadle.dev/spec-hash"
JOB_LABEL = "treadle.dev/job"
COMPONENT_LABEL = "treadle.dev/component"
POOL_LABEL = nodes.POOL_LABEL
REWARD_REQUESTS_PER_REPLICA = 32
CONFIG_MOUNT = "/etc/treadle"
FIELD_MANAGER = "treadle-operator"
COORDINATION = ("buffer", "scheduler", "placement")


def child_name(job: v1alpha1.RolloutJob, component: str, pool: str | None = None) -> str:
    return f"{job.name}-pool-{pool}" if pool is not None else f"{job.name}-{component}"


def selector(job: v1alpha1.RolloutJob, component: str, pool: str | None = None) -> dict[str, str]:
    """The labels that select one component's pods (stable across spec changes)."""
    labels = {JOB_LABEL: job.name, COMPONENT_LABEL: component}
    if pool is not None:
        labels[POOL_LABEL] = pool
    return labels


def _labels(
    job: v1alpha1.RolloutJob, cfg: config.OperatorConfig, component: str, pool: str | None
) -> dict[str, str]:
    return {
        **cfg.extra_labels,
        "app.kubernetes.io/name": "treadle",
        "app.kubernetes.io/instance": job.name,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/managed-by": FIELD_MANAGER,
        **selector(job, component, pool),
    }


def owner_reference(job: v1alpha1.RolloutJob) -> dict[str, Any]:
    return {
        "apiVersion": v1alpha1.API_VERSION,
        "kind": v1alpha1.KIND,
        "name": job.name,
        "uid": str(job.metadata.get("uid", "")),
        "controller": True,
        # Foreground deletion of the job waits for its children.
        "blockOwnerDeletion": True,
    }


def _meta(
    job: v1alpha1.RolloutJob, cfg: config.OperatorConfig, component: str, pool: str | None = None
) -> dict[str, Any]:
    return {
        "name": child_name(job, component, pool),
        "namespace": job.namespace,
        "labels": _labels(job, cfg, component, pool),
        "ownerReferences": [owner_reference(job)],
    }


def spec_hash(obj: dict[str, Any]) -> str:
    """A short digest of an object as rendered, excluding the hash annotation itself."""
    body = json.loads(json.dumps(obj))
    meta = body.get("metadata", {})
    meta.get("annotations", {}).pop(HASH_ANNOTATION, None)
    if meta.get("annotations") == {}:
        del meta["annotations"]
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]


def _stamp(obj: dict[str, Any]) -> dict[str, Any]:
    obj["metadata"].setdefault("annotations", {})[HASH_ANNOTATION] = spec_hash(obj)
    return obj


def endpoints(job: v1alpha1.RolloutJob) -> dict[str, Any]:
    """Where each component of the job listens, as in-cluster DNS names."""
    ns = job.namespace

    def host(component: str) -> str:
        return f"{child_name(job, component)}.{ns}.svc"

    out: dict[str, Any] = {name: f"{host(name)}:{config.PORTS[name]}" for name in (*COORDINATION, "weights")}
    out["env"] = f"http://{host('env')}:{config.PORTS['env']}"
    out["reward"] = f"http://{host('reward')}:{config.PORTS['reward']}"
    out["pools"] = {
        p.name: {
            "service": f"{child_name(job, 'pool', p.name)}.{ns}.svc",
            "agentPort": config.PORTS["agent"],
            "agent": p.agent,
            "accelerator": p.accelerator,
            "preferredWork": p.preferred_work,
            "tensorParallelSize": p.tensor_parallel_size,
        }
        for p in job.spec.pools
    }
    return out


def _env(job: v1alpha1.RolloutJob, cfg: config.OperatorConfig) -> list[dict[str, Any]]:
    ep = endpoints(job)
    pairs = {
        env_vars.JOB: job.name,
        env_vars.NAMESPACE: job.namespace,
        env_vars.CONFIG: f"{CONFIG_MOUNT}/job.json",
        env_vars.ENDPOINTS: f"{CONFIG_MOUNT}/endpoints.json",
        env_vars.KEY_PREFIX: f"{job.namespace}/{job.name}",
        env_vars.REDIS_URL: cfg.redis_url,
        env_vars.MOONCAKE_MASTER: cfg.mooncake_master,
        env_vars.MOONCAKE_METADATA_URL: cfg.mooncake_metadata_url,
        env_vars.SCHEDULER_ADDR: ep["scheduler"],
        env_vars.PLACEMENT_ADDR: ep["placement"],
        env_vars.BUFFER_ADDR: ep["buffer"],
        env_vars.ENV_URL: ep["env"],
        env_vars.REWARD_URL: ep["reward"],
    }
    return [{"name": k, "value": v} for k, v in pairs.items()]


def _config_volume(job: v1alpha1.RolloutJob) -> dict[str, Any]:
    return {"name": "treadle-config", "configMap": {"name": child_name(job, "config")}}


def _config_mount() -> dict[str, Any]:
    return {"name": "treadle-config", "mountPath": CONFIG_MOUNT, "readOnly": True}


def _service_container(
    job: v1alpha1.RolloutJob,
    cfg: config.OperatorConfig,
    component: str,
    *,
    image: str | None = None,
    resources: dict[str, Any] | None = None,
    extra_env: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    port = config.PORTS[component]
    grpc = component in (*COORDINATION, "weights")
    probe: dict[str, Any] = (
        {"grpc": {"port": port}} if grpc else {"httpGet": {"path": "/healthz", "port": port}}
    )
    env = _env(job, cfg) + [{"name": k, "value": v} for k, v in (extra_env or {}).items()]
    return {
        "name": component,
        "image": image or cfg.services_image,
        "imagePullPolicy": cfg.image_pull_policy,
        "command": ["python", "-m", config.MODULES[component], "--host", "0.0.0.0", "--port", str(port)],
        "ports": [{"name": "grpc" if grpc else "http", "containerPort": port, "protocol": "TCP"}],
        "env": env,
        "resources": resources
        or {"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"memory": "2Gi"}},
        "readinessProbe": {**probe, "periodSeconds": 5, "failureThreshold": 3},
        "livenessProbe": {**probe, "periodSeconds": 10, "failureThreshold": 6},
        "volumeMounts": [_config_mount()],
    }


def _deployment(
    job: v1alpha1.RolloutJob,
    cfg: config.OperatorConfig,
    component: str,
    *,
    replicas: int,
    pod_spec: dict[str, Any],
    pool: str | None = None,
    max_surge: int = 1,
) -> dict[str, Any]:
    meta = _meta(job, cfg, component, pool)
    return _stamp(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": meta,
            "spec": {
                "replicas": 0 if job.spec.suspend else replicas,
                "selector": {"matchLabels": selector(job, component, pool)},
                "strategy": {
                    "type": "RollingUpdate",
                    "rollingUpdate": {"maxSurge": max_surge, "maxUnavailable": 1},
                },
                "template": {
                    "metadata": {"labels": dict(meta["labels"])},
                    "spec": {
                        "enableServiceLinks": False,
                        # No API access unless a component's pod_spec names its ServiceAccount.
                        "automountServiceAccountToken": False,
                        "volumes": [_config_volume(job)],
                        **pod_spec,
                    },
                },
            },
        }
    )


def _service(
    job: v1alpha1.RolloutJob,
    cfg: config.OperatorConfig,
    component: str,
    ports: dict[str, int],
    *,
    pool: str | None = None,
    headless: bool = False,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "selector": selector(job, component, pool),
        "ports": [{"name": n, "port": p, "targetPort": p, "protocol": "TCP"} for n, p in ports.items()],
    }
    if headless:
        # DNS lists every ready pod; callers address the replicas themselves.
        spec["clusterIP"] = "None"
        spec["publishNotReadyAddresses"] = False
    return _stamp({"apiVersion": "v1", "kind": "Service", "metadata": _meta(job, cfg, component, pool),
                   "spec": spec})  # fmt: skip


def render_config(job: v1alpha1.RolloutJob, cfg: config.OperatorConfig) -> dict[str, Any]:
    """The ConfigMap every component mounts at ``/etc/treadle``."""
    spec_json = json.dumps(job.spec.model_dump(mode="json", by_alias=True, exclude_none=True), sort_keys=True)
    return _stamp(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": _meta(job, cfg, "config"),
            "data": {
                "job.json": spec_json,
                "endpoints.json": json.dumps(endpoints(job), sort_keys=True),
            },
        }
    )


def render_scheduler_identity(job: v1alpha1.RolloutJob, cfg: config.OperatorConfig) -> list[dict[str, Any]]:
    """The scheduler's ServiceAccount, allowed only to patch its own job (the reward-demand annotation)."""
    name = child_name(job, "scheduler")
    account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(job, cfg, "scheduler")}
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": _meta(job, cfg, "scheduler"),
        "rules": [
            {
                "apiGroups": [v1alpha1.GROUP],
                "resources": [v1alpha1.PLURAL],
                "resourceNames": [job.name],
                "verbs": ["patch"],
            }
        ],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": _meta(job, cfg, "scheduler"),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": job.namespace}],
    }
    return [_stamp(account), _stamp(role), _stamp(binding)]


def render_coordination(
    job: v1alpha1.RolloutJob, cfg: config.OperatorConfig, component: str
) -> list[dict[str, Any]]:
    """Deployment + Service of one per-job coordination service (scheduler, placement or buffer)."""
    extra = {
        env_vars.SCHEDULING_POLICY: job.spec.rollout.scheduling_policy,
        env_vars.PLACEMENT_POLICY: job.spec.rollout.placement_policy,
        env_vars.STALENESS: str(job.spec.rollout.staleness),
        env_vars.BATCH_SIZE: str(job.spec.rollout.batch_size),
    }
    container = _service_container(job, cfg, component, extra_env=extra)
    pod: dict[str, Any] = {"containers": [container]}
    if component == "scheduler":
        pod |= {"serviceAccountName": child_name(job, "scheduler"), "automountServiceAccountToken": True}
    # One replica: the service's state is per job and lives in this one process (or in Redis).
    deployment = _deployment(job, cfg, component, replicas=1, max_surge=0, pod_spec=pod)
    deployment["spec"]["strategy"] = {"type": "Recreate"}
    deployment = _stamp(deployment)
    # Headless: a single replica needs no virtual IP (gRPC resolves the pod through DNS), and
    # ClusterIPs are a scarce per-cluster range (a /24 in the dev cluster; 7 per job would not fit).
    service = _service(job, cfg, component, {"grpc": config.PORTS[component]}, headless=True)
    return [deployment, service]


def render_weights(job: v1alpha1.RolloutJob, cfg: config.OperatorConfig) -> list[dict[str, Any]]:
    """Mooncake store processes holding published weights (``weights.replicas`` copies); none for local."""
    if job.spec.weights.store != "mooncake":
        return []
    container = _service_container(
        job,
        cfg,
        "weights",
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
                "labelSelector": {"matchLabels": selector(job, "weights")},
            }
        ]
    }
    deployment = _deployment(
        job,
        cfg,
        "weights",
        replicas=job.spec.weights.replicas,
        pod_spec={"containers": [container], **spread},
    )
    # Headless: clients address each store process (each holds its own segment), not a balancer.
    return [deployment, _service(job, cfg, "weights", {"grpc": config.PORTS["weights"]}, headless=True)]


def render_environment(job: v1alpha1.RolloutJob, cfg: config.OperatorConfig) -> list[dict[str, Any]]:
    """The CPU environment pool: sandboxed sessions, one container per pod (RollArt §3.1 isolation)."""
    env = job.spec.environment
    quantity = {"cpu": env.cpu, "memory": env.memory}
    container = _service_container(
        job,
        cfg,
        "env",
        image=env.image,
        resources={"requests": dict(quantity), "limits": dict(quantity)},
        extra_env={
            env_vars.WARM_POOL: str(env.warm_pool),
            env_vars.CPU_PER_ACTION: job.spec.external_resources.cpu_cores_per_action,
            env_vars.ENVIRONMENTS: ",".join(sorted({t.environment for t in job.spec.tasks})),
        },
    )
    # CPU pods stay off GPU nodes: the GPU taint already keeps them away, the selector makes it explicit.
    pod = {"containers": [container], "nodeSelector": {nodes.ACCELERATOR_LABEL: "none"}}
    deployment = _deployment(job, cfg, "env", replicas=env.replicas, pod_spec=pod)
    # Headless: an environment session lives in one pod's memory, so the scheduler must open and
    # step it on the same pod; DNS lists every pod and a balancer would scatter the steps.
    return [deployment, _service(job, cfg, "env", {"http": config.PORTS["env"]}, headless=True)]


def reward_replicas(job: v1alpha1.RolloutJob) -> int:
    """Gateway replicas for the current demand: 0 when idle and scale-to-zero, up to maxReplicas."""
    reward = job.spec.reward
    raw = str(job.metadata.get("annotations", {}).get(v1alpha1.REWARD_DEMAND_ANNOTATION, "0"))
    demand = int(raw) if raw.isdigit() else 0
    idle = reward.min_replicas if reward.scale_to_zero else max(reward.min_replicas, 1)
    if demand == 0:
        return idle
    wanted = math.ceil(demand / REWARD_REQUESTS_PER_REPLICA)
    return min(reward.max_replicas, max(idle, 1, wanted))


def render_reward(job: v1alpha1.RolloutJob, cfg: config.OperatorConfig) -> list[dict[str, Any]]:
    """The reward gateway; its replicas follow ``reward_replicas``."""
    reward = job.spec.reward
    extra: dict[str, str] = {env_vars.REWARD_TYPE: reward.type}
    if reward.url is not None:
        extra[env_vars.REWARD_EXTERNAL_URL] = reward.url
    if reward.judge_model is not None:
        extra[env_vars.REWARD_JUDGE_MODEL] = reward.judge_model
    container = _service_container(job, cfg, "reward", extra_env=extra)
    pod: dict[str, Any] = {"containers": [container], "nodeSelector": {nodes.ACCELERATOR_LABEL: "none"}}
    gpus = job.spec.external_resources.reward_model_gpus
    if reward.type == "llm-judge" and gpus > 0:
        # The judge model runs on GPUs of its own (any class), as RollArt's reward LLM does.
        container["resources"] = {"limits": {nodes.GPU_RESOURCE: str(gpus)}, "requests": {"cpu": "2"}}
        pod["nodeSelector"] = {}
        pod["tolerations"] = [{"key": nodes.GPU_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}]
    deployment = _deployment(job, cfg, "reward", replicas=reward_replicas(job), pod_spec=pod)
    return [deployment, _service(job, cfg, "reward", {"http": config.PORTS["reward"]})]


LOCAL_WEIGHTS_DIR = "/var/lib/treadle/weights"
"""The node's directory a ``weights.store: local`` job publishes to and its engines read from."""
AGENT_STATE_DIR = "/var/run/treadle"
"""The inference pod's ``emptyDir`` where its agent keeps what it serves (lives as long as the pod)."""


def _weights_env(
    job: v1alpha1.RolloutJob, cfg: config.OperatorConfig, agent: v1alpha1.Agent
) -> list[dict[str, Any]]:
    """Where the engine's weights extension pulls published versions (``weights.loader.store_from_env``).

    The prefix is the job's; a multi-agent job's agents publish under ``<prefix>/<agent>``
    (``weights.layout.agent_prefix``), and the engine starts on its pool's agent's.
    """
    env = {env_vars.WEIGHTS_PREFIX: f"{job.namespace}/{job.name}"}
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
    vllm_port = config.PORTS["vllm"]
    vllm = {
        "name": "vllm",
        "image": agent.image,
        "imagePullPolicy": cfg.image_pull_policy,
        "command": ["python", "-m", config.VLLM_MODULE],
        "args": [
            "--host",
            "0.0.0.0",
            "--port",
            str(vllm_port),
            "--model",
            agent.model,
            "--served-model-name",
            agent.name,
            "--tensor-parallel-size",
            str(tp),
            "--max-model-len",
            str(agent.max_model_len),
            "--dtype",
            agent.dtype,
            "--worker-extension-cls",
            config.VLLM_WORKER_EXTENSION,
        ],
        "env": [
            {"name": "VLLM_SERVER_DEV_MODE", "value": "1"},
            *_env(job, cfg),
            *_weights_env(job, cfg, agent),
        ],
        "ports": [{"name": "openai", "containerPort": vllm_port, "protocol": "TCP"}],
        "resources": {
            "requests": {"cpu": str(4 * tp), "memory": f"{32 * tp}Gi", nodes.GPU_RESOURCE: str(tp)},
            "limits": {"memory": f"{64 * tp}Gi", nodes.GPU_RESOURCE: str(tp)},
        },
        # Loading a large model takes minutes: the startup probe covers it, not liveness.
        "startupProbe": {
            "httpGet": {"path": "/health", "port": vllm_port},
            "periodSeconds": 10,
            "failureThreshold": 90,
        },
        "readinessProbe": {"httpGet": {"path": "/health", "port": vllm_port}, "periodSeconds": 5},
        "volumeMounts": [
            _config_mount(),
            {"name": "dshm", "mountPath": "/dev/shm"},
            *(
                [{"name": "weights", "mountPath": LOCAL_WEIGHTS_DIR}]
                if job.spec.weights.store == "local"
                else []
            ),
        ],
    }
    sidecar = _service_container(
        job,
        cfg,
        "agent",
        extra_env={
            env_vars.ENGINE_URL: f"http://127.0.0.1:{vllm_port}",
            env_vars.AGENT: agent.name,
            env_vars.POOL: pool.name,
            env_vars.ACCELERATOR: pool.accelerator,
            env_vars.AGENT_STATE: f"{AGENT_STATE_DIR}/agent.json",
        },
    )
    sidecar["volumeMounts"].append({"name": "agent-state", "mountPath": AGENT_STATE_DIR})
    pod = {
        "containers": [vllm, sidecar],
        "nodeSelector": {**pool.node_selector, nodes.ACCELERATOR_LABEL: pool.accelerator},
        "tolerations": [
            {"key": nodes.GPU_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"},
            *(t.model_dump(exclude_none=True) for t in pool.tolerations),
        ],
        "terminationGracePeriodSeconds": 60,
    }
    deployment = _deployment(
        job, cfg, "pool", replicas=pool.replicas, pod_spec=pod, pool=pool.name, max_surge=0
    )
    # TP > 1 shares tensors through /dev/shm (NCCL); the container default of 64 MiB is too small.
    deployment["spec"]["template"]["spec"]["volumes"].append(
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{8 * tp}Gi"}}
    )
    # The agent keeps what a move made this worker serve across its own restarts (agent.served).
    deployment["spec"]["template"]["spec"]["volumes"].append({"name": "agent-state", "emptyDir": {}})
    if job.spec.weights.store == "local":
        deployment["spec"]["template"]["spec"]["volumes"].append(
            {"name": "weights", "hostPath": {"path": LOCAL_WEIGHTS_DIR, "type": "DirectoryOrCreate"}}
        )
    deployment = _stamp(deployment)
    ports = {"agent": config.PORTS["agent"], "openai": vllm_port}
    return [deployment, _service(job, cfg, "pool", ports, pool=pool.name, headless=True)]


def expected_replicas(job: v1alpha1.RolloutJob) -> dict[str, int]:
    """Replicas each child Deployment must have, by name (what ``render_children`` writes)."""
    spec = job.spec
    out = {child_name(job, c): 1 for c in COORDINATION}
    if spec.weights.store == "mooncake":
        out[child_name(job, "weights")] = spec.weights.replicas
    out[child_name(job, "env")] = spec.environment.replicas
    out[child_name(job, "reward")] = reward_replicas(job)
    out |= {child_name(job, "pool", p.name): p.replicas for p in spec.pools}
    return {name: 0 if spec.suspend else n for name, n in out.items()}


def render_children(job: v1alpha1.RolloutJob, cfg: config.OperatorConfig) -> list[dict[str, Any]]:
    """Every child of the job, in apply order (config first, inference pools last)."""
    # The ServiceAccount before the scheduler's Deployment: a pod naming a missing one is refused.
    out = [render_config(job, cfg), *render_scheduler_identity(job, cfg)]
    for component in COORDINATION:
        out += render_coordination(job, cfg, component)
    out += render_weights(job, cfg)
    out += render_environment(job, cfg)
    out += render_reward(job, cfg)
    for pool in job.spec.pools:
        out += render_pool(job, cfg, pool)
    return out


def key(obj: dict[str, Any]) -> tuple[str, str]:
    """How children are matched between rendered and observed: (kind, name)."""
    return (str(obj["kind"]), str(obj["metadata"]["name"]))
