"""The job's ConfigMap and its per-job coordination services (scheduler, placement, buffer)."""

from __future__ import annotations

import json
from typing import Any

from treadle.api import jobconfig, v1alpha1
from treadle.operator import config
from treadle.operator.render import common


def render_config(job: v1alpha1.RolloutJob, cfg: config.OperatorConfig) -> dict[str, Any]:
    """The ConfigMap every component mounts at ``/etc/treadle``."""
    return common.stamp(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": common.meta(job, cfg, "config"),
            "data": {
                "job.json": jobconfig.job_file(job),
                "endpoints.json": json.dumps(common.endpoints(job), sort_keys=True),
            },
        }
    )


def render_identity(
    job: v1alpha1.RolloutJob, cfg: config.OperatorConfig, component: str, *, status: bool = False
) -> list[dict[str, Any]]:
    """ServiceAccount, Role and RoleBinding of a component allowed to patch its own job and nothing
    else: the scheduler (the reward-demand annotation) and the feeder (the feeder-problem one).
    ``status``: also the job's status (the scheduler writes the trainer's progress there:
    ``policyVersion``, ``step``, ``meanReward``)."""
    name = common.child_name(job, component)
    account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": common.meta(job, cfg, component)}
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": common.meta(job, cfg, component),
        "rules": [
            {
                "apiGroups": [v1alpha1.GROUP],
                "resources": [v1alpha1.PLURAL, *([f"{v1alpha1.PLURAL}/status"] if status else [])],
                "resourceNames": [job.name],
                "verbs": ["patch"],
            }
        ],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": common.meta(job, cfg, component),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": job.namespace}],
    }
    return [common.stamp(account), common.stamp(role), common.stamp(binding)]


def runs_as_own_identity(job: v1alpha1.RolloutJob, component: str) -> dict[str, Any]:
    """The pod-spec fields that run a component as the account ``render_identity`` made for it."""
    return {"serviceAccountName": common.child_name(job, component), "automountServiceAccountToken": True}


def render_coordination(
    job: v1alpha1.RolloutJob, cfg: config.OperatorConfig, component: str
) -> list[dict[str, Any]]:
    """Deployment + Service of one per-job coordination service (scheduler, placement or buffer)."""
    proc = common.process(job, component)
    container = common.service_container(job, cfg, proc)
    pod: dict[str, Any] = {"containers": [container], **common.cpu_placement(job)}
    if component == "scheduler":
        pod |= runs_as_own_identity(job, "scheduler")
    # One replica (the topology's): the service's state is per job, in this one process (or in Redis).
    deployment = common.deployment(job, cfg, component, replicas=proc.replicas, max_surge=0, pod_spec=pod)
    deployment["spec"]["strategy"] = {"type": "Recreate"}
    deployment = common.stamp(deployment)
    # Headless: a single replica needs no virtual IP (gRPC resolves the pod through DNS), and
    # ClusterIPs are a scarce per-cluster range (a /24 in the dev cluster; 7 per job would not fit).
    service = common.service(job, cfg, component, {"grpc": config.PORTS[component]}, headless=True)
    return [deployment, service]
