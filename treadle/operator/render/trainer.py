"""The job's trainer (``spec.trainer``): a batch/v1 Job with the SDK's endpoints and the job file.

A Job, not a Deployment: the reference trainer runs ``spec.trainer.steps`` steps and exits 0, and a
Deployment would start it again (training the base model once more under newer version numbers).
A failed trainer is retried by the Job (``BACKOFF_LIMIT``, the pod restarted in place), and a
restarted trainer goes on from the job's committed version and step, its weights and Adam's state
pulled from the weight store (``treadle.trainer.job``); the versions it publishes continue after the
newest one in the store.

The pod gets what ``treadle.client.connect`` reads: the job file and every address (``common.pod_env``)
and the weight store the engines pull from (``pool.weights_env``, the trained agent's). It has no
ServiceAccount token: the trainer reaches the job's status only through its scheduler's commits.

A Job's pod template is immutable, so the Job's name carries a hash of it, and the template a digest
of the settings the trainer reads from the job file (``spec.trainer``, ``spec.rollout.batchSize`` and
``staleness``): a changed trainer renders a new Job and the old one is pruned (the diff deletes
what is no longer rendered), instead of an apply the API server would refuse. ``spec.suspend`` maps
to the Job's own ``suspend``, which may change in place.

A trainer of more than one process (``spec.trainer.replicas`` pods of ``processesPerPod`` ranks) is a
group under ``torchrun``: an Indexed Job of ``replicas`` completions, all running at once, each pod's
completion index its ``torchrun`` node rank, and a headless Service ``<job>-trainer-rdzv`` that
resolves to the pod of index 0, the group's rendezvous (rank 0's TCP store). The topology reaches
``torchrun`` as the ``PET_*`` variables it reads for its flags (``env_vars.TORCHRUN``), so the
reference trainer's command is ``python -m torch.distributed.run --module treadle.trainer.job`` and a
``torchrun`` command of the user's own needs no flag either. When a rank dies, the others fail in
their next collective, every container restarts in place (``OnFailure``; a pod that is deleted is
replaced by the Job for its index, once the old one is gone) and the group forms again; the
trainer resumes from the job's committed version. One process renders no Service, no ``torchrun``
and no ``PET_*``: the Job it always was.
"""

from __future__ import annotations

from typing import Any

from treadle.api import env_vars, nodes, v1alpha1
from treadle.api import trainer as trainer_api
from treadle.operator import config
from treadle.operator.render import common, pool

COMPONENT = "trainer"
BACKOFF_LIMIT = 3
SETTINGS_ANNOTATION = "treadle.dev/trainer-settings"
HASH_CHARS = 8
"""Characters of the template hash in the Job's name: ``<job>-trainer-<hash>`` is at most 57, and
the Job's pods (``<name>-<5 characters>``) stay within 63; so do a group's pod hostnames
(``<name>-<index>``, index below 64)."""
RDZV_SUFFIX = "-rdzv"
RDZV_PORT = 29500
"""``torchrun``'s default master port: rank 0's TCP store, where the group meets."""
RDZV_PORT_NAME = "rdzv"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
"""Label and annotation the Job controller puts on each pod of an Indexed Job: the pod's index."""
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
"""Label the Job controller puts on each pod of a Job: the Job's name."""
POD_INTERFACE = "eth0"
"""The pod's network interface, in Kubernetes as in the dev cluster (``devcluster.nodeagent.net``)."""
TORCHRUN = ["python", "-m", "torch.distributed.run"]
"""``torchrun`` as the inference image runs it (the module: no console script on the ``PATH`` needed)."""


def command(trainer: trainer_api.Trainer) -> list[str]:
    """The trainer's command: the spec's, or the reference trainer (under ``torchrun`` in a group)."""
    if trainer.command:
        return list(trainer.command)
    if trainer.distributed:
        return [*TORCHRUN, "--module", trainer_api.REFERENCE_MODULE]
    return ["python", "-m", trainer_api.REFERENCE_MODULE]


def rendezvous_name(job: v1alpha1.RolloutJob) -> str:
    """The group's rendezvous Service, ``<job>-trainer-rdzv`` (at most 57 + 5 characters)."""
    return common.child_name(job, COMPONENT) + RDZV_SUFFIX


def torchrun_env(job: v1alpha1.RolloutJob, trainer: trainer_api.Trainer) -> list[dict[str, Any]]:
    """The group's topology as the variables ``torchrun`` reads for its flags; a variable of
    ``spec.trainer.env`` of the same name wins (say ``GLOO_SOCKET_IFNAME`` on another interface)."""
    node_rank = {"fieldRef": {"fieldPath": f"metadata.annotations['{COMPLETION_INDEX}']"}}
    values: dict[str, dict[str, Any]] = {
        env_vars.TORCHRUN_NNODES: {"value": str(trainer.replicas)},
        env_vars.TORCHRUN_NPROC_PER_NODE: {"value": str(trainer.processes)},
        env_vars.TORCHRUN_NODE_RANK: {"valueFrom": node_rank},
        env_vars.TORCHRUN_MASTER_ADDR: {"value": f"{rendezvous_name(job)}.{job.namespace}.svc"},
        env_vars.TORCHRUN_MASTER_PORT: {"value": str(RDZV_PORT)},
        # gloo binds to the address the pod's hostname resolves to unless told an interface.
        env_vars.GLOO_SOCKET_IFNAME: {"value": POD_INTERFACE},
    }
    own = {e.name for e in trainer.env}
    return [{"name": name, **value} for name, value in values.items() if name not in own]


def render_trainer(job: v1alpha1.RolloutJob, cfg: config.OperatorConfig) -> list[dict[str, Any]]:
    """The trainer's Job (and a group's rendezvous Service), or nothing for a job whose trainer runs
    elsewhere."""
    trainer = job.spec.trainer
    if trainer is None:
        return []
    agent_name = trainer.agent or job.spec.agents[0].name
    agent = next(a for a in job.spec.agents if a.name == agent_name)
    local_weights = job.spec.weights.store == "local"
    reference = not trainer.command
    group = trainer.distributed
    gpus = {nodes.GPU_RESOURCE: str(trainer.gpus)} if trainer.gpus else {}
    container: dict[str, Any] = {
        "name": COMPONENT,
        "image": trainer.image or agent.image,
        "imagePullPolicy": cfg.image_pull_policy,
        "command": command(trainer),
        **({"args": list(trainer.args)} if trainer.args else {}),
        "env": [
            *({"name": e.name, "value": e.value} for e in trainer.env),
            *common.pod_env(job, cfg),
            *pool.weights_env(job, cfg, agent),
            *(torchrun_env(job, trainer) if group else ()),
        ],
        # The reference trainer serves /metrics (treadle.trainer.exporter); a trainer of the user's
        # own may not, and a declared port nobody serves would be a target always down.
        **({"ports": [common.metrics_port()]} if reference else {}),
        "resources": trainer.resources.rendered(**gpus),
        "volumeMounts": [
            common.config_mount(),
            *([pool.local_weights(job)[1]] if local_weights else []),
        ],
    }
    selector = dict(trainer.node_selector)
    if trainer.accelerator is not None:
        selector[nodes.ACCELERATOR_LABEL] = trainer.accelerator
    tolerations = [
        *(
            [{"key": nodes.GPU_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}]
            if trainer.gpus
            else []
        ),
        *(t.model_dump(exclude_none=True) for t in trainer.tolerations),
    ]
    metadata = common.meta(job, cfg, COMPONENT)
    # The trainer reads its settings from the job file once, at start: a changed setting must be
    # a new pod, so the template carries their digest (and the Job's name, the template's). The
    # group's shape is not read from the job file: it is the Job's and the pods' environment, which
    # the template already carries.
    settings = {
        "trainer": trainer.model_dump(mode="json", by_alias=True, exclude={"replicas", "processes_per_pod"}),
        "rollout": {"batchSize": job.spec.rollout.batch_size, "staleness": job.spec.rollout.staleness},
    }
    template: dict[str, Any] = {
        "metadata": {
            "labels": dict(metadata["labels"]),
            "annotations": {
                SETTINGS_ANNOTATION: common.spec_hash({"metadata": {}, "settings": settings}),
                **(common.scrape_annotations() if reference else {}),
            },
        },
        "spec": {
            "restartPolicy": "OnFailure",
            "enableServiceLinks": False,
            "automountServiceAccountToken": False,
            "containers": [container],
            **({"nodeSelector": selector} if selector else {}),
            **({"tolerations": tolerations} if tolerations else {}),
            "volumes": [
                common.config_volume(job),
                *([pool.local_weights(job)[0]] if local_weights else []),
            ],
        },
    }
    # The reference trainer runs in the inference image (root, as vLLM's official image): "baseline";
    # a trainer image of the user's may run as anyone.
    common.harden(template["spec"], non_root=False)
    common.mount_auth(job, template["spec"])
    spec: dict[str, Any] = {"backoffLimit": BACKOFF_LIMIT, "template": template}
    if group:
        spec |= {
            # One pod per index, all at once: torchrun's nodes, each its index as its node rank.
            "completionMode": "Indexed",
            "completions": trainer.replicas,
            "parallelism": trainer.replicas,
            # The Job counts every container restart of its pods against backoffLimit (OnFailure),
            # and one rank's death restarts every pod's container (the others fail in their next
            # collective): a group restart costs up to `replicas`, so the limit is BACKOFF_LIMIT
            # group restarts, as for one pod.
            "backoffLimit": BACKOFF_LIMIT * trainer.replicas,
            # A deleted or evicted pod is replaced only once it is gone: two pods of one index
            # never meet the group (nor the rendezvous name resolve to both).
            "podReplacementPolicy": "Failed",
        }
    metadata["name"] += "-" + common.spec_hash({"metadata": {}, "spec": spec})[:HASH_CHARS]
    out = [
        common.stamp(
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": metadata,
                "spec": {**spec, "suspend": job.spec.suspend},
            }
        )
    ]
    if group:
        out.append(render_rendezvous(job, cfg, metadata["name"]))
    return out


def job_name(job: v1alpha1.RolloutJob, cfg: config.OperatorConfig) -> str:
    """The name of the trainer Job the job renders (``<job>-trainer-<hash>``); '' without a trainer."""
    return next((o["metadata"]["name"] for o in render_trainer(job, cfg) if o["kind"] == "Job"), "")


def render_rendezvous(
    job: v1alpha1.RolloutJob, cfg: config.OperatorConfig, trainer_job: str
) -> dict[str, Any]:
    """The headless Service ``<job>-trainer-rdzv``: the pod of completion index 0 of the trainer's
    current Job (``trainer_job``), not yet ready too (a trainer pod has no readiness probe, and the
    group meets before any rank could be ready), so the name resolves to rank 0's pod from its start.

    Its selector names the current Job, so the pod 0 of a Job being replaced (still terminating,
    which a Service that publishes not-ready addresses would list) is never the address."""
    meta = common.meta(job, cfg, COMPONENT)
    meta["name"] = rendezvous_name(job)
    return common.stamp(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": meta,
            "spec": {
                "clusterIP": "None",
                "publishNotReadyAddresses": True,
                "selector": {
                    **common.selector(job, COMPONENT),
                    JOB_NAME_LABEL: trainer_job,
                    COMPLETION_INDEX: "0",
                },
                "ports": [
                    {"name": RDZV_PORT_NAME, "port": RDZV_PORT, "targetPort": RDZV_PORT, "protocol": "TCP"}
                ],
            },
        }
    )
