"""Pure status computation: observed children + cluster capacity -> RolloutJob status and Events.

Called by ``treadle.operator.handlers`` whenever a child Deployment or Pod of a job changes, and
after each reconcile. ``set_condition`` is the one writer of conditions: it keeps
``lastTransitionTime`` unless the status flips and always stamps ``observedGeneration``.

The trainer's pods give ``status.trainer`` (pods ready, finished, restarted), and a restart of its
group a ``TrainerRestarted`` Event.

Reasons are machine-readable (``reasons``) so a user, a dashboard or Kueue can tell "the cluster
has too few H800 GPUs" (InsufficientGPUCapacity) from "pods are starting" (PodsNotReady) from
"the image cannot be pulled" (ImagePullBackOff).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from treadle.api import v1alpha1
from treadle.operator import reasons, render
from treadle.operator.render import common as render_common
from treadle.operator.render import trainer as render_trainer


@dataclass(frozen=True)
class DeploymentState:
    """What the operator reads from one child Deployment."""

    desired: int
    ready: int
    updated: int
    current: bool
    """The Deployment controller has observed the latest spec (status.observedGeneration >= generation)."""


@dataclass(frozen=True)
class PodProblem:
    """A pod that will not become ready on its own, and why."""

    component: str
    pool: str | None
    reason: str
    message: str


@dataclass(frozen=True)
class TrainerPod:
    """What the operator reads from one pod of the job's trainer (``trainer_pod``)."""

    job: str
    """The batch/v1 Job it belongs to (``batch.kubernetes.io/job-name``)."""
    ready: bool
    """Running and ready, and not being deleted."""
    succeeded: bool
    """Exited 0 (phase Succeeded)."""
    failed: bool
    """Phase Failed (evicted, or its node lost): the Job replaces it."""
    restarts: int
    """Restarts of its containers."""


@dataclass(frozen=True)
class Observed:
    """Everything status depends on, gathered by the caller from the API (or kopf indexes)."""

    deployments: Mapping[str, DeploymentState] = field(default_factory=dict)
    """By Deployment name."""
    problems: Sequence[PodProblem] = ()
    gpu_capacity: Mapping[str, int] = field(default_factory=dict)
    """Allocatable ``nvidia.com/gpu`` summed over schedulable nodes, by accelerator class."""
    trainer_pods: Sequence[TrainerPod] = ()
    """The pods of the job's trainer Jobs, the current one's and any being deleted."""
    trainer_job: str = ""
    """The trainer Job the job renders now (``render.trainer``); only its pods count."""


TRAINER = "Trainer"
"""``Transition.type`` of a trainer group that restarted (no condition: an Event only)."""


@dataclass(frozen=True)
class Transition:
    """A condition that changed status, or (type ``TRAINER``) a trainer group that restarted: posted as
    a Kubernetes Event."""

    type: str
    status: str
    reason: str
    message: str

    @property
    def event_type(self) -> Literal["Normal", "Warning"]:
        bad = (
            (self.type == "Degraded" and self.status == "True")
            or (self.type == "Ready" and self.status == "False" and self.reason != reasons.SUSPENDED)
            or self.type == TRAINER
        )
        return "Warning" if bad else "Normal"

    @property
    def event_message(self) -> str:
        if self.type == TRAINER:
            return self.message
        return f"{self.type}={self.status}: {self.message}".rstrip(": ")


def set_condition(
    conditions: Sequence[v1alpha1.Condition],
    *,
    type: v1alpha1.ConditionType,
    status: Literal["True", "False", "Unknown"],
    reason: str,
    message: str,
    generation: int,
    now: str,
) -> tuple[list[v1alpha1.Condition], bool]:
    """Upsert one condition; returns the new list and whether ``status`` flipped."""
    old = next((c for c in conditions if c.type == type), None)
    flipped = old is None or old.status != status
    new = v1alpha1.Condition(
        type=type,
        status=status,
        reason=reason,
        message=message,
        last_transition_time=now if flipped or old is None else old.last_transition_time,
        observed_generation=generation,
    )
    out = [c for c in conditions if c.type != type] + [new]
    order = {t: i for i, t in enumerate(("Ready", "Progressing", "Degraded", "Suspended"))}
    return sorted(out, key=lambda c: order[c.type]), flipped


def gpu_shortfalls(job: v1alpha1.RolloutJob, capacity: Mapping[str, int]) -> list[str]:
    """One sentence per accelerator class the job asks more GPUs of than the whole cluster has."""
    demand: dict[str, tuple[int, list[str]]] = {}
    for pool in job.spec.pools:
        gpus = pool.replicas * pool.tensor_parallel_size
        total, names = demand.get(pool.accelerator, (0, []))
        demand[pool.accelerator] = (total + gpus, [*names, pool.name])
    out = []
    for accelerator, (gpus, names) in sorted(demand.items()):
        have = capacity.get(accelerator, 0)
        if gpus > have:
            out.append(
                f"pools {', '.join(names)} ask {gpus} {accelerator} GPUs (replicas x tensorParallelSize); "
                f"the cluster has {have} allocatable {accelerator} GPUs"
            )
    return out


def _components(job: v1alpha1.RolloutJob) -> list[tuple[str, str, str | None]]:
    """(deployment name, component, pool) of every Deployment the job renders."""
    out: list[tuple[str, str, str | None]] = [
        (render_common.child_name(job, c), c, None) for c in render_common.COORDINATION
    ]
    if job.spec.weights.store == "mooncake":
        out.append((render_common.child_name(job, "weights"), "weights", None))
    out += [
        (render_common.child_name(job, "env"), "env", None),
        (render_common.child_name(job, "reward"), "reward", None),
    ]
    out.append((render_common.child_name(job, "feeder"), "feeder", None))
    out += [(render_common.child_name(job, "pool", p.name), "pool", p.name) for p in job.spec.pools]
    return out


def _classify(job: v1alpha1.RolloutJob, observed: Observed) -> tuple[str, str] | None:
    """The Degraded reason and message, or None when nothing is broken."""
    if short := gpu_shortfalls(job, observed.gpu_capacity):
        return reasons.INSUFFICIENT_GPU_CAPACITY, "; ".join(short)
    by_reason: dict[str, list[PodProblem]] = {}
    problems = list(observed.problems)
    said = str(job.metadata.get("annotations", {}).get(v1alpha1.FEEDER_PROBLEM_ANNOTATION, ""))
    if said:
        problems.append(PodProblem("feeder", None, reasons.DATASET_UNUSABLE, said))
    for problem in problems:
        by_reason.setdefault(problem.reason, []).append(problem)
    for reason in reasons.DEGRADED_PRIORITY:
        if found := by_reason.get(reason):
            where = sorted({(p.pool and f"pool {p.pool}") or p.component for p in found})
            return reason, f"{', '.join(where)}: {found[0].message}"
    return None


def trainer_status(job: v1alpha1.RolloutJob, observed: Observed) -> v1alpha1.TrainerStatus | None:
    """The trainer group's pods, from the current Job's (None for a job without ``spec.trainer``)."""
    if job.spec.trainer is None:
        return None
    pods = [p for p in observed.trainer_pods if p.job == observed.trainer_job]
    return v1alpha1.TrainerStatus(
        job=observed.trainer_job,
        pods=0 if job.spec.suspend else job.spec.trainer.replicas,
        ready=sum(p.ready for p in pods),
        succeeded=sum(p.succeeded for p in pods),
        restarts=sum(p.restarts + p.failed for p in pods),
    )


def _trainer_restarted(
    prev: v1alpha1.TrainerStatus | None, new: v1alpha1.TrainerStatus | None
) -> Transition | None:
    """The Event of a group whose restarts went up since the last status (of the same Job)."""
    if prev is None or new is None or prev.job != new.job or new.restarts <= prev.restarts:
        return None
    return Transition(
        TRAINER,
        "Restarted",
        reasons.TRAINER_RESTARTED,
        f"trainer {new.job} restarted ({new.restarts} restarts in all, {new.restarts - prev.restarts} new): "
        "its group forms again",
    )


def compute(
    job: v1alpha1.RolloutJob, observed: Observed, *, now: str
) -> tuple[v1alpha1.RolloutJobStatus, list[Transition]]:
    """The job's new status and the condition transitions to report as Events."""
    generation = int(job.metadata.get("generation", 0))
    prev = job.status
    pools = []
    for pool in job.spec.pools:
        state = observed.deployments.get(render_common.child_name(job, "pool", pool.name))
        desired = 0 if job.spec.suspend else pool.replicas
        ready = min(state.ready, desired) if state is not None else 0
        pools.append(
            v1alpha1.PoolStatus(
                name=pool.name,
                accelerator=pool.accelerator,
                desired=desired,
                ready=ready,
                gpus=desired * pool.tensor_parallel_size,
            )
        )
    not_ready = []
    expected = render.expected_replicas(job)
    for name, component, pool_name in _components(job):
        state = observed.deployments.get(name)
        label = f"pool {pool_name}" if pool_name else component
        want = expected[name]
        if state is None:
            not_ready.append(f"{label} not created yet")
        elif state.desired != want or not state.current or state.ready < want or state.updated < want:
            not_ready.append(f"{label} {state.ready}/{want} ready")
    degraded = None if job.spec.suspend else _classify(job, observed)

    conds: list[v1alpha1.Condition] = list(prev.conditions)
    transitions: list[Transition] = []

    def put(
        type: v1alpha1.ConditionType, status: Literal["True", "False"], reason: str, message: str
    ) -> None:
        nonlocal conds
        conds, flipped = set_condition(
            conds, type=type, status=status, reason=reason, message=message, generation=generation, now=now
        )
        if flipped:
            transitions.append(Transition(type, status, reason, message))

    if job.spec.suspend:
        put("Suspended", "True", reasons.SUSPENDED, "spec.suspend is true: every child scaled to zero")
        put("Ready", "False", reasons.SUSPENDED, "the job is suspended")
        put("Progressing", "False", reasons.SUSPENDED, "the job is suspended")
        put("Degraded", "False", reasons.AS_EXPECTED, "")
        phase: v1alpha1.Phase = "Suspended"
    else:
        put("Suspended", "False", reasons.RUNNING, "")
        if degraded is not None:
            put("Degraded", "True", *degraded)
        else:
            put("Degraded", "False", reasons.AS_EXPECTED, "")
        if not_ready:
            why = degraded[0] if degraded is not None else reasons.PODS_NOT_READY
            put("Ready", "False", why, "; ".join(not_ready))
            put("Progressing", "True", reasons.PODS_NOT_READY, "; ".join(not_ready))
        else:
            put("Ready", "True", reasons.ALL_RESOURCES_READY, "every component is ready")
            put("Progressing", "False", reasons.RECONCILED, "")
        phase = "Degraded" if degraded is not None else ("Progressing" if not_ready else "Ready")
    full = sum(1 for p in pools if p.ready >= p.desired and (p.desired > 0 or job.spec.suspend))
    trainer = trainer_status(job, observed)
    if restarted := _trainer_restarted(prev.trainer, trainer):
        transitions.append(restarted)
    status = v1alpha1.RolloutJobStatus(
        observed_generation=generation,
        phase=phase,
        conditions=conds,
        pools=pools,
        pools_ready=f"{full}/{len(pools)}",
        policy_version=prev.policy_version,
        step=prev.step,
        mean_reward=prev.mean_reward,
        trainer=trainer,
    )
    return status, transitions


def drifted(job: v1alpha1.RolloutJob, observed: Observed) -> list[str]:
    """Child Deployments whose replica count differs from what the job renders (someone scaled them)."""
    expected = render.expected_replicas(job)
    return sorted(
        name
        for name, state in observed.deployments.items()
        if name in expected and state.desired != expected[name]
    )


def pod_problem(pod: Mapping[str, Any]) -> PodProblem | None:
    """Classify one Pod object (as the API returns it) into a problem, if it has one."""
    labels = pod.get("metadata", {}).get("labels", {})
    component = str(labels.get(render_common.COMPONENT_LABEL, "?"))
    pool = labels.get(render_common.POOL_LABEL) if component == "pool" else None
    status = pod.get("status", {})
    for cs in [*status.get("initContainerStatuses", []), *status.get("containerStatuses", [])]:
        waiting = cs.get("state", {}).get("waiting") or {}
        reason = waiting.get("reason", "")
        if reason in reasons.IMAGE_PULL_WAITING:
            image = cs.get("image", "?")
            return PodProblem(component, pool, reasons.IMAGE_PULL_BACK_OFF, f"cannot pull image {image}")
        if reason == "CrashLoopBackOff":
            name = cs.get("name", "?")
            return PodProblem(
                component, pool, reasons.CRASH_LOOP_BACK_OFF, f"container {name} keeps crashing"
            )
    for cond in status.get("conditions", []):
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            message = str(cond.get("message", ""))
            why = reasons.INSUFFICIENT_GPU_CAPACITY if "nvidia.com/gpu" in message else reasons.UNSCHEDULABLE
            return PodProblem(component, pool, why, message or "pod cannot be scheduled")
    return None


def trainer_pod(pod: Mapping[str, Any]) -> TrainerPod:
    """Read one pod of the trainer (as the API returns it)."""
    meta = pod.get("metadata", {})
    status = pod.get("status", {})
    phase = status.get("phase", "")
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions", []))
    restarts = sum(
        int(cs.get("restartCount", 0))
        for cs in [*status.get("initContainerStatuses", []), *status.get("containerStatuses", [])]
    )
    return TrainerPod(
        job=str(meta.get("labels", {}).get(render_trainer.JOB_NAME_LABEL, "")),
        ready=ready and phase == "Running" and not meta.get("deletionTimestamp"),
        succeeded=phase == "Succeeded",
        failed=phase == "Failed",
        restarts=restarts,
    )


def deployment_state(deployment: Mapping[str, Any]) -> DeploymentState:
    """Read one Deployment object (as the API returns it)."""
    spec = deployment.get("spec", {})
    status = deployment.get("status", {})
    generation = int(deployment.get("metadata", {}).get("generation", 0))
    return DeploymentState(
        desired=int(spec.get("replicas", 1)),
        ready=int(status.get("readyReplicas", 0)),
        updated=int(status.get("updatedReplicas", 0)),
        current=int(status.get("observedGeneration", 0)) >= generation,
    )


def node_gpus(node: Mapping[str, Any], accelerator_label: str, gpu_resource: str) -> tuple[str, int] | None:
    """(accelerator class, allocatable GPUs) of a schedulable GPU node; None for others."""
    labels = node.get("metadata", {}).get("labels", {})
    accelerator = labels.get(accelerator_label)
    if not accelerator or accelerator == "none" or node.get("spec", {}).get("unschedulable"):
        return None
    raw = str(node.get("status", {}).get("allocatable", {}).get(gpu_resource, "0"))
    return str(accelerator), int(raw) if raw.isdigit() else 0
