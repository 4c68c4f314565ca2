"""Where a RolloutJob stands and what blocks it, from the objects the API server returns.

Pure: ``explain`` takes the job, its child Deployments and Pods, the namespace's Events and the
cluster's GPU capacity as plain dicts (``Snapshot``, read by ``treadle.operator.jobreader``) and
returns a ``Report``; ``format_report`` prints it. Called by ``treadle status``. It classifies pods
with the operator's own ``status.pod_problem`` and ``status.gpu_shortfalls``, so ``treadle status``
and the job's ``Degraded`` condition give the same reasons; it adds what a condition has no room
for: every blocked component with its pod count, the scheduler's own words from ``FailedScheduling``
Events, the last termination message of a crash-looping container, and a reward gateway left at
zero while the scheduler reports scoring work waiting.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from treadle import errors
from treadle.api import v1alpha1
from treadle.operator import reasons, render, status
from treadle.operator.render import common as render_common

REWARD_GATEWAY_DOWN = "RewardGatewayDown"
"""The scheduler reports scoring requests waiting but no reward gateway replica is ready."""


@dataclass(frozen=True)
class Snapshot:
    """The objects ``explain`` reads, as the API server returns them."""

    job: Mapping[str, Any]
    deployments: Sequence[Mapping[str, Any]] = ()
    """The job's child Deployments."""
    pods: Sequence[Mapping[str, Any]] = ()
    """The job's pods."""
    events: Sequence[Mapping[str, Any]] = ()
    """Events of the job's namespace (only those about its pods are read)."""
    gpu_capacity: Mapping[str, int] | None = None
    """Allocatable GPUs by accelerator class; None when the nodes could not be read."""


@dataclass(frozen=True)
class Pool:
    name: str
    accelerator: str
    desired: int
    ready: int
    gpus_per_replica: int


@dataclass(frozen=True)
class Blocker:
    """One thing that keeps the job from progressing."""

    where: str
    """``pool NAME`` or a component (``scheduler``, ``reward``, ``feeder``...)."""
    reason: str
    message: str
    pods: int = 0
    """Pods affected (0 when the blocker is not about pods)."""


@dataclass(frozen=True)
class Report:
    name: str
    namespace: str
    phase: str
    conditions: list[v1alpha1.Condition]
    pools: list[Pool]
    step: int
    policy_version: int
    blockers: list[Blocker]
    failures: dict[str, int] = field(default_factory=dict)
    """Container restarts by last termination reason (``Error``, ``OOMKilled``...)."""
    rollout: v1alpha1.RolloutProgress | None = None
    """The scheduler's counts, throughput, staleness and failure reasons (None before it reports)."""
    trainer: v1alpha1.TrainerStatus | None = None
    """The trainer group's pods as the operator last counted them (None without ``spec.trainer``)."""


def _where(pod: Mapping[str, Any]) -> str:
    labels = pod.get("metadata", {}).get("labels", {})
    component = str(labels.get(render_common.COMPONENT_LABEL, "?"))
    pool = labels.get(render_common.POOL_LABEL)
    return f"pool {pool}" if component == "pool" and pool else component


def _event_time(event: Mapping[str, Any]) -> str:
    # Events written through events.k8s.io carry eventTime and no lastTimestamp; core ones the reverse.
    return str(event.get("lastTimestamp") or event.get("eventTime") or "")


def _scheduling_messages(events: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """The latest FailedScheduling message per pod name: the scheduler's reason, node counts and all."""
    out: dict[str, str] = {}
    for event in sorted(events, key=_event_time):
        involved = event.get("involvedObject", {})
        if event.get("reason") == "FailedScheduling" and involved.get("kind") == "Pod":
            out[str(involved.get("name", ""))] = str(event.get("message", ""))
    return out


def _with_scheduler_message(pod: Mapping[str, Any], scheduling: Mapping[str, str]) -> Mapping[str, Any]:
    """The pod with its PodScheduled=False message replaced by the latest FailedScheduling Event's.

    The condition keeps the first attempt's words; the Event, the scheduler's latest. The pod is
    then classified by ``status.pod_problem``, as the operator classifies it.
    """
    latest = scheduling.get(str(pod.get("metadata", {}).get("name", "")))
    st = pod.get("status", {})
    if latest is None:
        return pod
    conditions = [
        {**c, "message": latest} if c.get("type") == "PodScheduled" and c.get("status") == "False" else c
        for c in st.get("conditions", [])
    ]
    return {**pod, "status": {**st, "conditions": conditions}}


def _last_termination(pod: Mapping[str, Any]) -> str:
    """The crashing container's last exit: code, reason and the message it left (terminationMessagePath)."""
    for cs in pod.get("status", {}).get("containerStatuses", []):
        if cs.get("state", {}).get("waiting", {}).get("reason") != "CrashLoopBackOff":
            continue
        last = cs.get("lastState", {}).get("terminated") or {}
        parts = [f"exit code {last.get('exitCode', '?')}", str(last.get("reason", ""))]
        if message := str(last.get("message", "")).strip():
            parts.append(f"last message: {message.splitlines()[-1][:300]}")
        restarts = int(cs.get("restartCount", 0))
        return f"container {cs.get('name', '?')} restarted {restarts} times; " + ", ".join(
            p for p in parts if p
        )
    return ""


def _pod_blockers(snapshot: Snapshot) -> list[Blocker]:
    scheduling = _scheduling_messages(snapshot.events)
    grouped: dict[tuple[str, str, str], int] = {}
    for pod in snapshot.pods:
        if pod.get("metadata", {}).get("deletionTimestamp"):
            continue
        problem = status.pod_problem(_with_scheduler_message(pod, scheduling))
        if problem is None:
            continue
        message = problem.message
        if problem.reason == reasons.CRASH_LOOP_BACK_OFF:
            message = _last_termination(pod) or message
        key = (_where(pod), problem.reason, message)
        grouped[key] = grouped.get(key, 0) + 1
    return [
        Blocker(where, reason, message, pods=n) for (where, reason, message), n in sorted(grouped.items())
    ]


def _failures(pods: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for pod in pods:
        for cs in pod.get("status", {}).get("containerStatuses", []):
            restarts = int(cs.get("restartCount", 0))
            if restarts:
                why = str((cs.get("lastState", {}).get("terminated") or {}).get("reason") or "Unknown")
                out[why] = out.get(why, 0) + restarts
    return dict(sorted(out.items()))


def _not_ready(
    job: v1alpha1.RolloutJob, states: Mapping[str, status.DeploymentState], *, explained: set[str]
) -> list[Blocker]:
    """Components short of ready replicas that no pod problem above already explains."""
    out = []
    for name, want in render.expected_replicas(job).items():
        # Children are named <job>-<component> and <job>-pool-<pool> (render_common.child_name).
        where = name.removeprefix(f"{job.name}-").replace("pool-", "pool ", 1)
        state = states.get(name)
        ready = state.ready if state is not None else 0
        if ready < want and where not in explained:
            have = "no Deployment yet" if state is None else f"{ready}/{want} replicas ready"
            out.append(Blocker(where, reasons.PODS_NOT_READY, have))
    return out


def _reward_blocker(job: v1alpha1.RolloutJob, states: Mapping[str, status.DeploymentState]) -> Blocker | None:
    raw = str(job.metadata.get("annotations", {}).get(v1alpha1.REWARD_DEMAND_ANNOTATION, "0"))
    demand = int(raw) if raw.isdigit() else 0
    gateway = states.get(render_common.child_name(job, "reward"))
    if demand == 0 or (gateway is not None and gateway.ready > 0):
        return None
    have = "no Deployment" if gateway is None else f"{gateway.ready}/{gateway.desired} replicas ready"
    return Blocker(
        "reward",
        REWARD_GATEWAY_DOWN,
        f"{demand} scoring requests waiting ({v1alpha1.REWARD_DEMAND_ANNOTATION}) "
        f"but the reward gateway has {have}",
    )


def explain(snapshot: Snapshot) -> Report:
    """The job's state and its blockers, most fundamental first (spec, capacity, pods, then the rest)."""
    raw = snapshot.job
    meta = raw.get("metadata", {})
    st = v1alpha1.RolloutJobStatus.model_validate(raw.get("status") or {})
    blockers: list[Blocker] = []
    pools: list[Pool] = []
    try:
        job = v1alpha1.parse_job(raw)
    except errors.SpecError as exc:
        # The operator renders nothing for an invalid spec: nothing below it can be judged.
        blockers.append(Blocker("spec", reasons.INVALID_SPEC, str(exc)))
        job = None
    if job is not None and not job.spec.suspend:
        states = {
            str(d.get("metadata", {}).get("name", "")): status.deployment_state(d)
            for d in snapshot.deployments
        }
        if snapshot.gpu_capacity is not None:
            blockers += [
                Blocker("cluster", reasons.INSUFFICIENT_GPU_CAPACITY, short)
                for short in status.gpu_shortfalls(job, snapshot.gpu_capacity)
            ]
        blockers += _pod_blockers(snapshot)
        for p in job.spec.pools:
            state = states.get(render_common.child_name(job, "pool", p.name))
            ready = min(state.ready, p.replicas) if state is not None else 0
            pools.append(Pool(p.name, p.accelerator, p.replicas, ready, p.tensor_parallel_size))
        blockers += _not_ready(job, states, explained={b.where for b in blockers})
        if reward := _reward_blocker(job, states):
            blockers.append(reward)
        if said := str(meta.get("annotations", {}).get(v1alpha1.FEEDER_PROBLEM_ANNOTATION, "")):
            blockers.append(Blocker("feeder", reasons.DATASET_UNUSABLE, said))
    return Report(
        name=str(meta.get("name", "")),
        namespace=str(meta.get("namespace", "default")),
        phase=st.phase,
        conditions=list(st.conditions),
        pools=pools,
        step=st.step,
        policy_version=st.policy_version,
        blockers=blockers,
        failures=_failures(snapshot.pods),
        rollout=st.rollout,
        trainer=st.trainer,
    )


def format_report(report: Report) -> str:
    """The report as ``treadle status`` prints it: a few aligned sections, blockers last."""
    lines = [
        f"RolloutJob {report.namespace}/{report.name}: {report.phase}",
        f"  step {report.step}, policy version {report.policy_version}",
        "Conditions:",
    ]
    for c in report.conditions:
        lines.append(f"  {c.type:<12} {c.status:<7} {c.reason}" + (f": {c.message}" if c.message else ""))
    if report.pools:
        lines.append("Pools:")
        for p in report.pools:
            lines.append(
                f"  {p.name:<16} {p.accelerator:<6} {p.ready}/{p.desired} ready  "
                f"({p.desired * p.gpus_per_replica} GPUs, TP {p.gpus_per_replica})"
            )
    if (r := report.rollout) is not None:
        lines += [
            "Rollout (the scheduler's counts since it started):",
            f"  {r.completed} completed, {r.failed} failed, {r.aborted} aborted; {r.pending} pending, "
            f"{r.in_flight} in flight; {r.trajectories_per_minute:g} trajectories/min; "
            f"max staleness {r.max_staleness}",
        ]
        if r.failures:
            lines.append("  failed or aborted: " + ", ".join(f"{f.reason} {f.count}" for f in r.failures))
    if (t := report.trainer) is not None:
        lines.append(
            f"Trainer {t.job}: {t.ready}/{t.pods} pods ready, {t.succeeded} finished, {t.restarts} restarts"
        )
    if report.failures:
        lines.append(
            "Container restarts by reason: " + ", ".join(f"{k} {v}" for k, v in report.failures.items())
        )
    if not report.blockers:
        lines.append("Nothing blocks it.")
    else:
        lines.append("Blocked by:")
        for b in report.blockers:
            count = f" ({b.pods} pod{'s' if b.pods != 1 else ''})" if b.pods else ""
            lines.append(f"  {b.where}{count}: {b.reason}: {b.message}")
    return "\n".join(lines) + "\n"
