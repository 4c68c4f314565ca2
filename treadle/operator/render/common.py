"""The names, labels, hashes and pod parts every child of a job shares (``treadle.operator.render``)."""

from __future__ import annotations

import copy
import hashlib
import json
import typing
from collections.abc import Mapping
from typing import Any

from treadle import auth, topology
from treadle.api import env_vars, nodes, v1alpha1
from treadle.operator import config

HASH_ANNOTATION = "treadle.dev/spec-hash"
JOB_LABEL = "treadle.dev/job"
COMPONENT_LABEL = "treadle.dev/component"
POOL_LABEL = nodes.POOL_LABEL
CONFIG_MOUNT = "/etc/treadle"
AUTH_MOUNT = "/var/run/secrets/treadle"
"""Where the job's Secret (``render.security.render_secret``) is mounted in its Treadle containers."""
FIELD_MANAGER = "treadle-operator"
COORDINATION = ("buffer", "scheduler", "placement")
METRICS_PATH = "/metrics"


def child_name(job: v1alpha1.RolloutJob, component: str, pool: str | None = None) -> str:
    return f"{job.name}-pool-{pool}" if pool is not None else f"{job.name}-{component}"


def selector(job: v1alpha1.RolloutJob, component: str, pool: str | None = None) -> dict[str, str]:
    """The labels that select one component's pods (stable across spec changes)."""
    labels = {JOB_LABEL: job.name, COMPONENT_LABEL: component}
    if pool is not None:
        labels[POOL_LABEL] = pool
    return labels


def labels(
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


def meta(
    job: v1alpha1.RolloutJob, cfg: config.OperatorConfig, component: str, pool: str | None = None
) -> dict[str, Any]:
    return {
        "name": child_name(job, component, pool),
        "namespace": job.namespace,
        "labels": labels(job, cfg, component, pool),
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


def stamp(obj: dict[str, Any]) -> dict[str, Any]:
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


def job_prefix(namespace: str, name: str, uid: str) -> str:
    """``<namespace>/<job>/<uid>``: where this job keeps its state in the shared stores (its Redis keys
    and Redis user, its weight versions), so no other job reaches it.

    The uid tells a job from an earlier one of the same name: a deleted job's state outlives it where
    its deletion does not reach in time or at all (the node's local weight store, the Mooncake master;
    its Redis keys, deleted by the operator without a finalizer, so possibly after a job of the same
    name was created again), and a re-created job took it up before: the committed version and step of
    the deleted one, or versions far ahead of its own steps. ``treadle render`` of a file has no uid
    (the API server assigns it): the segment is left out there.
    """
    return "/".join(part for part in (namespace, name, uid) if part)


def prefix_of(job: v1alpha1.RolloutJob) -> str:
    """``job_prefix`` of a parsed job."""
    return job_prefix(job.namespace, job.name, str(job.metadata.get("uid", "")))


def site(job: v1alpha1.RolloutJob) -> topology.Site:
    """Where the job runs in its cluster: its Services' DNS names, its mounted job file, its key prefix."""
    ep = endpoints(job)
    return topology.Site(
        addresses={c: ep[c] for c in topology.COMPONENT_ADDRESSES},
        config_path=f"{CONFIG_MOUNT}/job.json",
        key_prefix=prefix_of(job),
    )


def process(job: v1alpha1.RolloutJob, component: str, pool: str | None = None) -> topology.Process:
    """The job topology's process of ``component`` (of ``pool``, for a pool's ``vllm`` and ``agent``)."""
    return next(p for p in topology.processes(job, site(job)) if p.component == component and p.pool == pool)


def deployment_env(job: v1alpha1.RolloutJob, cfg: config.OperatorConfig) -> dict[str, str]:
    """What every Treadle container of a job gets beside its process's environment (``topology``):
    the cluster's side of it, in this one place. Its namespace (the scheduler and feeder report on
    their job there), the endpoint map of its ConfigMap, the shared Redis and Mooncake master, the
    ``metrics`` port, and the job's Secret as mounted files (token, Redis password)."""
    pairs = {
        env_vars.NAMESPACE: job.namespace,
        env_vars.ENDPOINTS: f"{CONFIG_MOUNT}/endpoints.json",
        env_vars.REDIS_URL: cfg.redis_url,
        env_vars.MOONCAKE_MASTER: cfg.mooncake_master,
        env_vars.MOONCAKE_METADATA_URL: cfg.mooncake_metadata_url,
        env_vars.METRICS_PORT: str(config.PORTS["metrics"]),
        env_vars.TOKEN_FILE: f"{AUTH_MOUNT}/{auth.TOKEN_KEY}",
    }
    if cfg.redis_password:  # the job has its own Redis user (treadle.operator.redisacl)
        pairs[env_vars.REDIS_PASSWORD_FILE] = f"{AUTH_MOUNT}/{auth.REDIS_PASSWORD_KEY}"
    return pairs


ENV_ORDER = (
    env_vars.JOB, env_vars.NAMESPACE, env_vars.CONFIG, env_vars.ENDPOINTS, env_vars.KEY_PREFIX,
    env_vars.REDIS_URL, env_vars.MOONCAKE_MASTER, env_vars.MOONCAKE_METADATA_URL, env_vars.SCHEDULER_ADDR,
    env_vars.PLACEMENT_ADDR, env_vars.BUFFER_ADDR, env_vars.ENV_URL, env_vars.REWARD_URL,
    env_vars.METRICS_PORT, env_vars.TOKEN_FILE, env_vars.REDIS_PASSWORD_FILE,
    env_vars.ENGINE_URL, env_vars.AGENT, env_vars.POOL, env_vars.AGENT_STATE,
)  # fmt: skip
"""The order of a container's variables (others after them, as given): the order pods had before the
topology, kept so that no rendered pod changes (a reordered env changes every hash and rolls every pod)."""


def pod_env(
    job: v1alpha1.RolloutJob,
    cfg: config.OperatorConfig,
    proc: topology.Process | None = None,
    extra: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    """A Treadle container's variables: its process's (``proc``; None: what every process of the job
    gets, ``topology.job_env``), the cluster's (``deployment_env``) and the container's ``extra``."""
    own = proc.env if proc is not None else topology.job_env(job, site(job))
    pairs = {**own, **deployment_env(job, cfg), **(extra or {})}
    rank = {name: i for i, name in enumerate(ENV_ORDER)}
    return [{"name": k, "value": pairs[k]} for k in sorted(pairs, key=lambda k: rank.get(k, len(rank)))]


def metrics_port() -> dict[str, Any]:
    """The container port a Treadle process serves ``/metrics`` on (``TREADLE_METRICS_PORT``)."""
    return {"name": "metrics", "containerPort": config.PORTS["metrics"], "protocol": "TCP"}


def scrape_annotations() -> dict[str, str]:
    """Pod annotations a plain Prometheus' ``kubernetes_sd`` pod job keeps and scrapes by."""
    return {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(config.PORTS["metrics"]),
        "prometheus.io/path": METRICS_PATH,
    }


def mount_auth(job: v1alpha1.RolloutJob, pod: dict[str, Any]) -> None:
    """Mount the job's Secret (its token and Redis password) into every container of ``pod`` that
    carries the job's variables (``pod_env``), read-only."""
    pod.setdefault("volumes", []).append(
        {"name": "treadle-auth", "secret": {"secretName": child_name(job, "auth")}}
    )
    for container in pod["containers"]:
        if any(e.get("name") == env_vars.TOKEN_FILE for e in container.get("env", ())):
            container.setdefault("volumeMounts", []).append(
                {"name": "treadle-auth", "mountPath": AUTH_MOUNT, "readOnly": True}
            )


def not_on_gpu_nodes() -> dict[str, Any]:
    """Node affinity keeping a pod off GPU nodes, with no label needed on the CPU nodes.

    A node is a GPU node if NVIDIA's feature discovery marked it (``nvidia.com/gpu.present``, on
    clusters running the GPU operator) or Treadle's label names a GPU class (the label the inference
    pools select on; a CPU node may carry ``none`` or nothing). ``NotIn`` and ``DoesNotExist`` both
    match a node without the label, so an unlabelled CPU node qualifies.
    """
    gpu_classes = sorted(typing.get_args(v1alpha1.Accelerator))
    term = {
        "matchExpressions": [
            {"key": nodes.GPU_PRESENT_LABEL, "operator": "DoesNotExist"},
            {"key": nodes.ACCELERATOR_LABEL, "operator": "NotIn", "values": gpu_classes},
        ]
    }
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}


def cpu_placement(job: v1alpha1.RolloutJob) -> dict[str, Any]:
    """The pod-spec fields placing a CPU pod (``spec.placement.cpu``): by default off GPU nodes."""
    cpu = job.spec.placement.cpu
    out: dict[str, Any] = {}
    if cpu.avoid_gpu_nodes:
        out["affinity"] = not_on_gpu_nodes()
    if cpu.node_selector:
        out["nodeSelector"] = dict(cpu.node_selector)
    if cpu.tolerations:
        out["tolerations"] = [t.model_dump(exclude_none=True) for t in cpu.tolerations]
    return out


def config_volume(job: v1alpha1.RolloutJob) -> dict[str, Any]:
    return {"name": "treadle-config", "configMap": {"name": child_name(job, "config")}}


def config_mount() -> dict[str, Any]:
    return {"name": "treadle-config", "mountPath": CONFIG_MOUNT, "readOnly": True}


def service_container(
    job: v1alpha1.RolloutJob,
    cfg: config.OperatorConfig,
    proc: topology.Process,
    *,
    image: str | None = None,
    resources: dict[str, Any] | None = None,
    extra_env: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The container of a Treadle process of the job topology: its module, arguments and variables
    (``pod_env``), bound to all interfaces on its port. ``extra_env``: the pod's own wiring."""
    port = proc.port
    grpc = proc.protocol == "grpc"
    probe: dict[str, Any] = (
        {"grpc": {"port": port}} if grpc else {"httpGet": {"path": "/healthz", "port": port}}
    )
    return {
        "name": proc.component,
        "image": image or cfg.services_image,
        "imagePullPolicy": cfg.image_pull_policy,
        "command": ["python", "-m", proc.module, "--host", "0.0.0.0", "--port", str(port), *proc.args],
        "ports": [
            {"name": "grpc" if grpc else "http", "containerPort": port, "protocol": "TCP"},
            # The Mooncake store process (weights) keeps no Treadle metrics.
            *([metrics_port()] if proc.metrics else []),
        ],
        "env": pod_env(job, cfg, proc, extra_env),
        "resources": resources
        or {"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"memory": "2Gi"}},
        "readinessProbe": {**probe, "periodSeconds": 5, "failureThreshold": 3},
        "livenessProbe": {**probe, "periodSeconds": 10, "failureThreshold": 6},
        "volumeMounts": [config_mount()],
    }


NON_ROOT_UID = 65532
"""The user Treadle's services and env images run as (``images/*/Dockerfile``: ``USER 65532``)."""
CONTAINER_SECURITY: dict[str, Any] = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
"""What Pod Security "restricted" asks of every container, besides running as non-root."""
NON_ROOT: dict[str, Any] = {"runAsNonRoot": True, "runAsUser": NON_ROOT_UID, "runAsGroup": NON_ROOT_UID}


def harden(pod_spec: dict[str, Any], *, non_root: bool = True) -> None:
    """Pod Security "restricted" for ``pod_spec`` (docs/SECURITY.md): the runtime's default seccomp
    profile, no privilege escalation, no capability, and (``non_root``) uid 65532; a container that
    set its own ``securityContext`` keeps it. ``non_root=False`` for pods whose image runs as root
    (the inference image: vLLM's official image has no user of its own), which then meet "baseline"."""
    pod_spec.setdefault(
        "securityContext",
        {
            **(NON_ROOT | {"fsGroup": NON_ROOT_UID} if non_root else {}),
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    )
    for container in [*pod_spec.get("initContainers", ()), *pod_spec["containers"]]:
        container.setdefault("securityContext", copy.deepcopy(CONTAINER_SECURITY))


def deployment(
    job: v1alpha1.RolloutJob,
    cfg: config.OperatorConfig,
    component: str,
    *,
    replicas: int,
    pod_spec: dict[str, Any],
    pool: str | None = None,
    max_surge: int = 1,
    non_root: bool = True,
) -> dict[str, Any]:
    metadata = meta(job, cfg, component, pool)
    scraped = any(p["name"] == "metrics" for c in pod_spec["containers"] for p in c.get("ports", ()))
    template_spec: dict[str, Any] = {
        "enableServiceLinks": False,
        # No API access unless a component's pod_spec names its ServiceAccount.
        "automountServiceAccountToken": False,
        "volumes": [config_volume(job)],
        **pod_spec,
    }
    harden(template_spec, non_root=non_root)
    mount_auth(job, template_spec)
    return stamp(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": metadata,
            "spec": {
                "replicas": 0 if job.spec.suspend else replicas,
                "selector": {"matchLabels": selector(job, component, pool)},
                "strategy": {
                    "type": "RollingUpdate",
                    "rollingUpdate": {"maxSurge": max_surge, "maxUnavailable": 1},
                },
                "template": {
                    "metadata": {
                        "labels": dict(metadata["labels"]),
                        **({"annotations": scrape_annotations()} if scraped else {}),
                    },
                    "spec": template_spec,
                },
            },
        }
    )


def service(
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
    return stamp({"apiVersion": "v1", "kind": "Service", "metadata": meta(job, cfg, component, pool),
                   "spec": spec})  # fmt: skip


def key(obj: dict[str, Any]) -> tuple[str, str]:
    """How children are matched between rendered and observed: (kind, name)."""
    return (str(obj["kind"]), str(obj["metadata"]["name"]))
