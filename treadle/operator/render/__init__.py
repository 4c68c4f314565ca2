"""Pure renderers: RolloutJob (+ operator config) -> the Kubernetes objects it owns.

One module per kind of child (``coordination``: the ConfigMap and the per-job coordination
services; ``backends``: weights, environments and the reward gateway; ``pool``: inference pools),
on ``common``'s names, labels and pod parts; this module composes them.

Called by ``treadle.operator.reconcile`` (which diffs and applies what these return) and by the
snapshot tests. No I/O, no clock: the same job and config always render byte-identical objects,
and each object carries a hash of itself so the reconciler re-applies only what changed.

Children of job ``J`` (all in J's namespace, owned by J through a controller ownerReference, so
the garbage collector deletes them with J even while the operator is down):

- ``J-auth`` Secret (the job's token and Redis password) and ``J-network`` NetworkPolicy (only the
  job's own pods, and Prometheus on metrics ports, reach its pods): ``security``.
- ``J-config`` ConfigMap: the validated spec (``job.json``, ``treadle.api.jobconfig.job_file``) and
  the endpoint map every component reads. The spec reaches every service only there: no
  ``TREADLE_*`` variable repeats a spec field (``treadle.api.env_vars.RENDERED``).
- ``J-scheduler``, ``J-placement``, ``J-buffer`` Deployments + Services: per-job coordination.
- ``J-scheduler`` ServiceAccount + Role + RoleBinding: the scheduler reports reward demand on the
  job and the trainer's progress on its status, allowed to ``patch`` this one RolloutJob (and its
  status) and nothing else. Every pod but the scheduler and
  the feeder runs without a ServiceAccount token.
- ``J-weights`` Deployment + Service (Mooncake store processes; only for ``weights.store: mooncake``).
- ``J-env`` Deployment + Service: CPU environment pods.
- ``J-feeder`` Deployment + Service: the feeder (each dataset task's rows, each other task's
  environment seeds 0, 1, 2, ...), with a
  ServiceAccount + Role + RoleBinding like the scheduler's: it may patch this one RolloutJob, to say
  why it cannot read a dataset (``v1alpha1.FEEDER_PROBLEM_ANNOTATION``).
- ``J-reward`` Deployment + Service: the reward gateway, 0 replicas when idle and scale-to-zero.
  It is the only ClusterIP Service (stateless, idempotent scoring behind a balancer); the others
  are headless: singletons, stateful env sessions and per-replica inference/store addresses.
- ``J-pool-P`` Deployment + headless Service per inference pool: vLLM + the agent sidecar.
- ``J-trainer-H`` batch/v1 Job (only with ``spec.trainer``): the job's trainer, run to the end of its
  steps; ``H`` hashes its immutable pod template (``trainer``). A trainer of more than one process
  is a ``torchrun`` group: an Indexed Job and the headless Service ``J-trainer-rdzv`` (pod 0, where
  the group meets).

Per-job coordination services, not shared ones: the scheduler, placement and buffer hold per-job
state (staleness window, policy version, sticky worker map, group bookkeeping) and per-job policy
choices (``rollout.schedulingPolicy``/``placementPolicy``); one process per job keeps a crash or a
restart inside one job, lets a job be suspended or deleted by scaling or garbage-collecting its
own pods, and needs no registration protocol or multi-tenant authorization inside the services.
Only the stateful backends are shared and installed by the chart: Redis (the experience store) and
the Mooncake master, a job's keys in both prefixed ``<namespace>/<job>/<uid>`` (``common.job_prefix``).
"""

from __future__ import annotations

from typing import Any

from treadle import topology
from treadle.api import v1alpha1
from treadle.operator import config
from treadle.operator.render import backends, common, coordination, feeder, pool, security, trainer


def expected_replicas(job: v1alpha1.RolloutJob) -> dict[str, int]:
    """Replicas each child Deployment must have, by name (what ``render_children`` writes)."""
    # A pool's Deployment is its pods of vLLM and the agent sidecar, named for the pool.
    out = {
        common.child_name(job, "pool", p.pool) if p.pool else common.child_name(job, p.component): p.replicas
        for p in topology.processes(job, common.site(job))
    }
    return {name: 0 if job.spec.suspend else n for name, n in out.items()}


def render_children(job: v1alpha1.RolloutJob, cfg: config.OperatorConfig) -> list[dict[str, Any]]:
    """Every child of the job, in apply order (config first, then services and pools, the trainer last)."""
    # The ServiceAccount before the scheduler's Deployment: a pod naming a missing one is refused;
    # the Secret before every pod that mounts it, the NetworkPolicy before any pod it fences.
    out = [
        coordination.render_config(job, cfg),
        security.render_secret(job, cfg),
        security.render_network_policy(job, cfg),
        *coordination.render_identity(job, cfg, "scheduler", status=True),
    ]
    for component in common.COORDINATION:
        out += coordination.render_coordination(job, cfg, component)
    out += backends.render_weights(job, cfg)
    out += backends.render_environment(job, cfg)
    out += backends.render_reward(job, cfg)
    out += feeder.render_feeder(job, cfg)
    for p in job.spec.pools:
        out += pool.render_pool(job, cfg, p)
    out += trainer.render_trainer(job, cfg)
    return out
