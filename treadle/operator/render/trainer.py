"""The job's trainer (``spec.trainer``): a batch/v1 Job with the SDK's endpoints and the job file.

A Job, not a Deployment: the reference trainer runs ``spec.trainer.steps`` steps and exits 0, and a
Deployment would start it again (training the base model once more under newer version numbers).
A failed trainer is retried by the Job (``BACKOFF_LIMIT``, the pod restarted in place), and a
restarted trainer starts again from the job's base checkpoint: optimizer and weights are not
checkpointed yet; the versions it publishes continue after the newest one in the store.

The pod gets what ``treadle.client.connect`` reads: the job file and every address (``common.pod_env``)
and the weight store the engines pull from (``pool.weights_env``, the trained agent's). It has no
ServiceAccount token: the trainer reaches the job's status only through its scheduler's commits.

A Job's pod template is immutable, so the Job's name carries a hash of it, and the template a digest
of the settings the trainer reads from the job file (``spec.trainer``, ``spec.rollout.batchSize`` and
``staleness``): a changed trainer renders a new Job and the old one is pruned (the diff deletes
what is no longer rendered), instead of an apply the API server would refuse. ``spec.suspend`` maps
to the Job's own ``suspend``, which may change in place.
"""

from __future__ import annotations

from typing import Any

from treadle.api import nodes, v1alpha1
from treadle.api import trainer as trainer_api
from treadle.operator import config
from treadle.operator.render import common, pool

COMPONENT = "trainer"
BACKOFF_LIMIT = 3
SETTINGS_ANNOTATION = "treadle.dev/trainer-settings"
HASH_CHARS = 8
"""Characters of the template hash in the Job's name: ``<job>-trainer-<hash>`` is at most 57, and
the Job's pods (``<name>-<5 characters>``) stay within 63."""


def command(trainer: trainer_api.Trainer) -> list[str]:
    """The trainer's command: the spec's, or the reference trainer."""
    return list(trainer.command) or ["python", "-m", trainer_api.REFERENCE_MODULE]


def render_trainer(job: v1alpha1.RolloutJob, cfg: config.OperatorConfig) -> list[dict[str, Any]]:
    """The trainer's Job, or nothing for a job whose trainer runs elsewhere."""
    trainer = job.spec.trainer
    if trainer is None:
        return []
    agent_name = trainer.agent or job.spec.agents[0].name
    agent = next(a for a in job.spec.agents if a.name == agent_name)
    local_weights = job.spec.weights.store == "local"
    reference = not trainer.command
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
    # a new pod, so the template carries their digest (and the Job's name, the template's).
    settings = {
        "trainer": trainer.model_dump(mode="json", by_alias=True),
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
    spec = {"backoffLimit": BACKOFF_LIMIT, "template": template}
    metadata["name"] += "-" + common.spec_hash({"metadata": {}, "spec": spec})[:HASH_CHARS]
    return [
        common.stamp(
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": metadata,
                "spec": {**spec, "suspend": job.spec.suspend},
            }
        )
    ]
