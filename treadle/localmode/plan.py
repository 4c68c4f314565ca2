"""What local mode starts for a RolloutJob: the pure translation from the job to service configs.

Called by ``treadle.localmode.run`` before any process starts, and by its unit tests. Everything the
services need comes from the job (``treadle.api.v1alpha1``); what only local mode decides (how many
simulated workers fit on this machine, how many trajectories to run, tokens per turn) comes from
the command line as ``Options``.
"""

from __future__ import annotations

import dataclasses
import math

from treadle.api import v1alpha1
from treadle.errors import SpecError
from treadle.policy.flexmarl import load_balance
from treadle.services.placement import service as placement_service
from treadle.services.scheduler import protocol as scheduler_protocol

REWARD_COLD_START_S = 180.0
"""How long the scheduler waits out an unavailable reward gateway that can scale to zero (a pod's
scheduling, image pull and start, with margin) before failing a trajectory."""


@dataclasses.dataclass(frozen=True)
class Options:
    trajectories: int = 256
    """Trajectories to run in all (rounded up to whole groups)."""
    max_workers_per_pool: int = 2
    """Simulated engines started per pool at most (the job's replica count is for a cluster)."""
    env_servers: int = 2
    max_tokens: int = 128
    max_in_flight: int = 256
    max_num_seqs: int = 256
    """Sequences each simulated engine runs at once."""
    engine_step_ms: float = 0.0
    """Simulated time per decode step (0: as fast as the machine goes)."""
    rebalance_interval_s: float | None = None
    """Seconds between placement's inter-agent rebalance polls (0: never); None: the job's."""
    seed: int = 0


@dataclasses.dataclass(frozen=True)
class Worker:
    worker_id: str
    pool: str


@dataclasses.dataclass(frozen=True)
class RebalanceConfig:
    """Placement's inter-agent rebalancing, from ``spec.rollout.rebalance`` (``v1alpha1.Rebalance``)."""

    interval_s: float
    """Seconds between polls; 0 when the job does not rebalance."""
    delta: float
    rule: load_balance.Rule
    max_moves_per_poll: int
    settle_polls: int


def rebalance_config(spec: v1alpha1.Rebalance, *, enabled: bool) -> RebalanceConfig:
    return RebalanceConfig(
        interval_s=spec.interval_seconds if enabled else 0.0, delta=spec.delta, rule=spec.rule,
        max_moves_per_poll=spec.max_moves_per_poll, settle_polls=spec.settle_polls,
    )  # fmt: skip


@dataclasses.dataclass(frozen=True)
class JobConfig:
    """What the coordination services run for a job, in local mode and in a cluster alike."""

    job: str
    tasks: list[scheduler_protocol.TaskConfig]
    settings: scheduler_protocol.Settings
    pools: dict[str, str]
    """Pool -> preferred work (placement's hardware affinity)."""
    task_placement: dict[str, placement_service.TaskPlacement]
    task_weights: dict[str, float]
    batch_size: int
    alpha: int
    placement_policy: str
    agents: list[str]
    """Agents the buffer's micro-batch pipeline updates together: every policy of a multi-agent job
    (FlexMARL), none for a single policy (the barrier then spans whoever streams)."""
    rebalance: RebalanceConfig
    """Placement's inter-agent rebalancing (off unless the job has two agents of one shape)."""
    pool_agents: dict[str, str] = dataclasses.field(default_factory=dict)
    """Pool -> the agent it serves (placement's per-agent turns and inter-agent rebalancing)."""
    pool_shapes: dict[str, str] = dataclasses.field(default_factory=dict)
    """Pool -> instance shape (model, TP, accelerator): rebalancing moves workers only within one."""


def job_config(
    job: v1alpha1.RolloutJob, *, max_tokens: int, max_in_flight: int, max_concurrent_generations: int
) -> JobConfig:
    """The one translation of a RolloutJob into scheduler, placement and buffer configs.

    Called by ``make_plan`` (local mode) and by ``treadle.services.podenv`` (a service started by
    the operator from the job's ConfigMap); the three counts are what only the caller knows.
    """
    spec = job.spec
    models = {a.name: a.model for a in spec.agents}
    tasks = [
        scheduler_protocol.TaskConfig(
            name=t.name, env=t.environment, agent=t.agents[0],
            agents=tuple(t.agents) if len(t.agents) > 1 else (), reward_fn=t.reward, group_size=t.group_size,
            redundancy=t.redundancy, max_turns=t.max_turns, max_tokens=max_tokens,
        )
        for t in spec.tasks
    ]  # fmt: skip
    settings = scheduler_protocol.Settings(
        alpha=spec.rollout.staleness,
        batch_size=spec.rollout.batch_size,
        max_in_flight=max_in_flight,
        max_concurrent_generations=max_concurrent_generations,
        scheduling_policy=spec.rollout.scheduling_policy,
        # A gateway scaled to zero answers Unavailable until its first pod is ready: wait that out.
        reward_unavailable_s=REWARD_COLD_START_S if spec.reward.scale_to_zero else 0.0,
    )
    pool_shapes = {
        p.name: f"{models[p.agent]}/tp{p.tensor_parallel_size}/{p.accelerator}" for p in spec.pools
    }
    agents_by_shape: dict[str, set[str]] = {}
    for p in spec.pools:
        agents_by_shape.setdefault(pool_shapes[p.name], set()).add(p.agent)
    # Unset: on exactly when a move is possible, i.e. two agents have pools of one shape.
    rebalance = spec.rollout.rebalance
    enabled = rebalance.enabled
    if enabled is None:
        enabled = any(len(agents) > 1 for agents in agents_by_shape.values())
    return JobConfig(
        job=job.name,
        tasks=tasks,
        settings=settings,
        pools={p.name: p.preferred_work for p in spec.pools},
        task_placement={
            t.name: placement_service.TaskPlacement(t.affinity, tuple(t.pools)) for t in spec.tasks
        },
        task_weights={t.name: t.weight for t in spec.tasks},
        batch_size=spec.rollout.batch_size,
        alpha=spec.rollout.staleness,
        placement_policy=spec.rollout.placement_policy,
        agents=[a.name for a in spec.agents] if len(spec.agents) > 1 else [],
        pool_agents={p.name: p.agent for p in spec.pools},
        pool_shapes=pool_shapes,
        rebalance=rebalance_config(rebalance, enabled=enabled),
    )


@dataclasses.dataclass(frozen=True)
class Plan:
    config: JobConfig
    """The services' configs, as a cluster would run them (``job_config``)."""
    workers: list[Worker]
    replicas_in_job: dict[str, int]
    groups: list[tuple[str, str, int]]
    """(group id, task, seed) to submit, tasks in turn by weight order."""
    max_model_len: int
    trajectories: int
    reward: v1alpha1.Reward
    """The job's scorer, given to the reward gateway as its pod gets it (``run.reward_env``)."""


def make_plan(job: v1alpha1.RolloutJob, options: Options) -> Plan:
    spec = job.spec
    if options.trajectories < 1:
        raise SpecError("must be >= 1", field="--trajectories", value=options.trajectories)
    workers = [
        Worker(worker_id=f"{pool.name}-{i}", pool=pool.name)
        for pool in spec.pools
        for i in range(min(pool.replicas, options.max_workers_per_pool))
    ]
    if not workers:
        raise SpecError("every pool has 0 replicas: nothing can generate", field="spec.pools")
    # One scheduler gate as large as every engine together holds turns back in one queue shared by all
    # agents; with several agents, turns must wait in their own agent's engines, where placement
    # measures each agent's queue for rebalancing (FlexMARL's per-agent request queues).
    gate = options.max_in_flight if len(job.spec.agents) > 1 else len(workers) * options.max_num_seqs
    cfg = job_config(
        job, max_tokens=options.max_tokens, max_in_flight=options.max_in_flight,
        max_concurrent_generations=gate,
    )  # fmt: skip
    # Whole groups, tasks taken in proportion to their weights (largest share first, then by name).
    members = {t.name: t.members for t in cfg.tasks}
    total_weight = sum(t.weight for t in spec.tasks)
    groups: list[tuple[str, str, int]] = []
    started = 0
    for t in sorted(spec.tasks, key=lambda t: (-t.weight, t.name)):
        want = math.ceil(options.trajectories * t.weight / total_weight / members[t.name])
        for g in range(want):
            groups.append((f"{t.name}-{g}", t.name, options.seed * 1_000_003 + g))
        started += want * members[t.name]
    return Plan(
        config=cfg,
        workers=workers,
        replicas_in_job={p.name: p.replicas for p in spec.pools},
        groups=groups,
        max_model_len=max(a.max_model_len for a in spec.agents),
        trajectories=started,
        reward=spec.reward,
    )
