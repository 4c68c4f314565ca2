"""What local mode alone decides for a RolloutJob: workers, groups to submit and the scheduler's counts.

Called by ``treadle.localmode.run`` before any process starts, and by its unit tests. The services'
configs are ``treadle.api.jobconfig``'s translation of the job, which every service makes itself
from the job file (as in a pod); what only local mode decides (how many simulated workers fit on
this machine, how many trajectories to run, tokens per turn) comes from the command line as
``Options``.
"""

from __future__ import annotations

import dataclasses
import math

import pydantic

from treadle.api import jobconfig, v1alpha1
from treadle.errors import SpecError


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
    """Seconds between placement's inter-agent rebalance polls (0: never); None: the job's. Written
    into the job's ``spec.rollout.rebalance`` (``with_rebalance``), which placement reads."""
    seed: int = 0
    tokens_for: tuple[tuple[str, int], ...] = ()
    """Tests and benchmarks: an engine request whose id (``<trajectory>.t<turn>.<random>``) matches a
    pattern generates that many tokens (``fakevllm --tokens-for``); others end by the engine's hash."""


@dataclasses.dataclass(frozen=True)
class Worker:
    worker_id: str
    pool: str


@dataclasses.dataclass(frozen=True)
class Counts:
    """What only local mode decides of the scheduler's configuration, passed to it as flags."""

    max_tokens: int
    max_in_flight: int
    max_concurrent_generations: int


@dataclasses.dataclass(frozen=True)
class Plan:
    job: v1alpha1.RolloutJob
    """The job, written as the job file every service reads (``jobconfig.job_file``)."""
    config: jobconfig.JobConfig
    """The services' configs with local mode's counts (what each service builds from the job file)."""
    counts: Counts
    workers: list[Worker]
    replicas_in_job: dict[str, int]
    groups: list[tuple[str, str, int]]
    """(group id, task, seed) to submit, tasks in turn by weight order."""
    max_model_len: int
    trajectories: int


def make_plan(job: v1alpha1.RolloutJob, options: Options) -> Plan:
    if options.rebalance_interval_s is not None:
        job = with_rebalance(job, options.rebalance_interval_s)
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
    counts = Counts(max_tokens=options.max_tokens, max_in_flight=options.max_in_flight,
                    max_concurrent_generations=gate)  # fmt: skip
    cfg = jobconfig.job_config(job, **dataclasses.asdict(counts))
    # Whole groups, tasks taken in proportion to their weights (largest share first, then by name).
    members = {t.name: t.members for t in cfg.scheduler.tasks}
    total_weight = sum(t.weight for t in spec.tasks)
    groups: list[tuple[str, str, int]] = []
    started = 0
    for t in sorted(spec.tasks, key=lambda t: (-t.weight, t.name)):
        want = math.ceil(options.trajectories * t.weight / total_weight / members[t.name])
        for g in range(want):
            groups.append((f"{t.name}-{g}", t.name, options.seed * 1_000_003 + g))
        started += want * members[t.name]
    return Plan(
        job=job,
        config=cfg,
        counts=counts,
        workers=workers,
        replicas_in_job={p.name: p.replicas for p in spec.pools},
        groups=groups,
        max_model_len=max(a.max_model_len for a in spec.agents),
        trajectories=started,
    )


def with_rebalance(job: v1alpha1.RolloutJob, interval_s: float) -> v1alpha1.RolloutJob:
    """``job`` rebalancing every ``interval_s`` whatever its spec says (0: never), as placement reads it."""
    rollout = job.spec.rollout
    given = {"enabled": False} if interval_s == 0 else {"enabled": True, "intervalSeconds": interval_s}
    try:
        rebalance = v1alpha1.Rebalance.model_validate(
            {**rollout.rebalance.model_dump(by_alias=True, exclude_none=True), **given}
        )
    except pydantic.ValidationError as exc:
        raise SpecError(exc.errors()[0]["msg"], field="--rebalance-interval", value=interval_s) from exc
    rollout = rollout.model_copy(update={"rebalance": rebalance})
    return job.model_copy(update={"spec": job.spec.model_copy(update={"rollout": rollout})})
