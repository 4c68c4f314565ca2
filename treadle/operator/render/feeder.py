"""The job's feeder (``python -m treadle.services.feeder``) and the volumes its datasets need.

Rendered only for a job with a dataset task (``spec.tasks[].dataset``). One replica with strategy
``Recreate``: the feeder's position lives in Redis and two feeders would race on it (a rolling
update would run the new pod beside the old). It mounts what the sources name: each ConfigMap at
``treadle.api.dataset.CONFIG_MAP_MOUNT/<name>`` (so a key is the file ``<name>/<key>``), and each of
``spec.feeder.volumes`` at its ``mountPath`` (``path`` sources and the Hugging Face cache lie under
one, a rule of ``treadle.api.spec_rules``). ``url`` sources need nothing mounted.

A dataset the feeder cannot read is the job's configuration to fix, not a crash: the feeder stays up
(alive, not ready), writes the reason on its job (``v1alpha1.FEEDER_PROBLEM_ANNOTATION``, which its
Role allows and nothing else) and reads again; the operator turns it into ``Degraded``. On the job
rather than as a condition on its own Pod: a Role can pin one RolloutJob by name but not a Pod whose
name is random, so ``pods/status`` would let the feeder rewrite every pod's status in the namespace.
"""

from __future__ import annotations

from typing import Any

from treadle.api import dataset as dataset_api
from treadle.api import v1alpha1
from treadle.operator import config
from treadle.operator.render import common, coordination


def dataset_tasks(job: v1alpha1.RolloutJob) -> list[v1alpha1.Task]:
    return [t for t in job.spec.tasks if t.dataset is not None]


def _volumes(job: v1alpha1.RolloutJob) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(pod volumes, container mounts) of the job's ConfigMap sources and ``spec.feeder.volumes``."""
    maps = sorted({t.dataset.source.config_map.name for t in dataset_tasks(job)
                   if t.dataset is not None and t.dataset.source.config_map is not None})  # fmt: skip
    volumes: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    for i, name in enumerate(maps):
        volumes.append({"name": f"dataset-configmap-{i}", "configMap": {"name": name}})
        mount = str(dataset_api.CONFIG_MAP_MOUNT / name)
        mounts.append({"name": f"dataset-configmap-{i}", "mountPath": mount, "readOnly": True})
    for v in job.spec.feeder.volumes:
        source: dict[str, Any]
        if v.persistent_volume_claim is not None:
            claim = v.persistent_volume_claim
            source = {"persistentVolumeClaim": {"claimName": claim.claim_name, "readOnly": claim.read_only}}
        else:
            assert v.host_path is not None  # a spec rule: exactly one source
            source = {"hostPath": {"path": v.host_path.path, "type": "Directory"}}
        volumes.append({"name": f"data-{v.name}", **source})
        mounts.append({"name": f"data-{v.name}", "mountPath": v.mount_path, "readOnly": True})
    return volumes, mounts


def render_feeder(job: v1alpha1.RolloutJob, cfg: config.OperatorConfig) -> list[dict[str, Any]]:
    """Identity, Deployment and headless Service of the feeder: every job has one (it feeds each
    dataset task's rows and the seeds of each task without a dataset)."""
    proc = common.process(job, "feeder")
    container = common.service_container(job, cfg, proc, resources=job.spec.feeder.resources.rendered())
    # Alive while it serves at all: a feeder that cannot read a dataset stays up, not ready, and says
    # why (its /healthz fails), so liveness must not restart it into a crash loop.
    container["livenessProbe"] = {"tcpSocket": {"port": config.PORTS["feeder"]}, "periodSeconds": 10,
                                  "failureThreshold": 6}  # fmt: skip
    volumes, mounts = _volumes(job)
    container["volumeMounts"] += mounts
    pod = {
        "containers": [container], **common.cpu_placement(job),
        **coordination.runs_as_own_identity(job, "feeder"),
    }  # fmt: skip
    deployment = common.deployment(job, cfg, "feeder", replicas=proc.replicas, max_surge=0, pod_spec=pod)
    deployment["spec"]["strategy"] = {"type": "Recreate"}
    deployment["spec"]["template"]["spec"]["volumes"] += volumes
    deployment = common.stamp(deployment)
    # Headless: one pod; the Service names its /metrics and /v1/feeds port for scrapers and people.
    service = common.service(job, cfg, "feeder", {"http": config.PORTS["feeder"]}, headless=True)
    # The account before the Deployment: a pod naming a missing one is refused.
    return [*coordination.render_identity(job, cfg, "feeder"), deployment, service]
