"""One run's RolloutJob and simulation settings as pools, workers and tasks.

Called once per run by ``treadle.sim.engine.Simulator``. The job reaches the simulator as it reaches
the live services: through ``treadle.api.jobconfig.job_config`` (``job_config`` below), whose tasks
(agents, group size and members, pool restriction, affinity), task weights, pool -> preferred work
and agent, settings (staleness, batch size, policies) the run uses. What only the simulator decides
is here: ``pools[]`` (accelerator, replicas, tensorParallelSize) become continuous-batching
``entities.Worker``s on a ``cost.Roofline`` of that accelerator, a task's eligible pools come from
``affinity.eligible_pools(affinity.resolve(affinity, profile), ...)`` with the profile of its
simulated workload, and the trainer's GPUs are the rollout pools' when the system is colocated,
else the scenario's training pool.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

from treadle import errors
from treadle.api import jobconfig
from treadle.policy import affinity, bounds, costmodel
from treadle.sim import cost as cost_mod
from treadle.sim import entities, scenario, workloads


@dataclasses.dataclass(frozen=True)
class Task:
    name: str
    agents: tuple[str, ...]
    eligible: Mapping[str, tuple[str, ...]]
    """Agent -> pools its turns may use (after affinity)."""
    workload: workloads.Workload
    group_size: int
    launched: int
    weight: float
    reward_kind: str
    work: str | None


@dataclasses.dataclass(frozen=True)
class Pool:
    agent: str
    tp: int
    accelerator: str


@dataclasses.dataclass(frozen=True)
class Layout:
    """What a run simulates on: workers by pool, tasks, and the trainer's GPUs."""

    config: jobconfig.JobConfig
    """The job as every live service gets it (``job_config``)."""
    workers: list[entities.Worker]
    pool_workers: dict[str, list[entities.Worker]]
    pools: dict[str, Pool]
    engines: dict[str, dict[str, tuple[cost_mod.EngineCost, int]]]
    """Agent -> pool -> (engine cost, max running sequences): what ``chain`` prices turns on."""
    tasks: list[Task]
    shape0: costmodel.ModelShape
    """The first agent's model: the one the trainer trains and the weight sync moves."""
    train_gpus: int
    train_acc: costmodel.Accelerator

    def chain(self, traj: entities.Trajectory) -> list[bounds.Segment]:
        """The trajectory as ``bounds`` segments: latency at batch 1, work at the pool's best rate."""
        task = self.tasks[traj.task]
        segs = [bounds.Segment(wait_s=traj.reset_s)]
        context = 0
        for turn in range(traj.turns):
            agent = task.agents[turn % len(task.agents)]
            added, out = traj.shape_inputs[turn], traj.shape_responses[turn]
            cached = int(context * task.workload.prefix_reuse)
            latency: dict[str, float] = {}
            work: dict[str, float] = {}
            priced: dict[int, tuple[float, float]] = {}
            for pool, (engine, max_seqs) in self.engines[agent].items():
                key = id(engine)
                if key not in priced:  # pools of one accelerator class price a turn alike
                    priced[key] = _turn_cost(engine, max_seqs, context, cached, added, out)
                latency[pool], work[pool] = priced[key]
            segs.append(bounds.Segment(latency=latency, work=work))
            segs.append(bounds.Segment(wait_s=traj.shape_tools[turn]))
            context += added + out
        return segs


def job_config(config: scenario.RunConfig) -> jobconfig.JobConfig:
    """The run's job translated as for the live services, with the simulator's counts.

    Its in-flight window, and as many generations at once as every simulated engine holds (local
    mode's gate). Tokens per turn come from the workloads, never from a cap: the cluster's default
    stands in.
    """
    return jobconfig.job_config(
        config.job, max_tokens=jobconfig.TaskConfig.max_tokens, max_in_flight=config.max_in_flight,
        max_concurrent_generations=sum(p.replicas for p in config.job.spec.pools) * config.max_seqs,
    )  # fmt: skip


def build(
    config: scenario.RunConfig, order: Callable[[Sequence[entities.Request]], list[entities.Request]]
) -> Layout:
    """The run's layout; ``order`` is the scheduling policy every worker orders its waiting turns by."""
    spec = config.job.spec
    job = job_config(config)
    workers: list[entities.Worker] = []
    pool_workers: dict[str, list[entities.Worker]] = {}
    pools: dict[str, Pool] = {}
    width = len(str(sum(p.replicas for p in spec.pools)))
    by_key: dict[tuple[str, str, int], cost_mod.Roofline] = {}
    engines: dict[str, dict[str, tuple[cost_mod.EngineCost, int]]] = {}
    for pool in spec.pools:
        acc = costmodel.accelerator(pool.accelerator)
        shape = config.models[pool.agent]
        kv = costmodel.kv_capacity_tokens(acc, shape, tp=pool.tensor_parallel_size)
        if kv <= 0:
            raise errors.SpecError(
                f"{shape.name} does not fit on {pool.tensor_parallel_size}x{acc.name}",
                field=f"spec.pools.{pool.name}.tensorParallelSize",
            )
        engine_key = (acc.name, shape.name, pool.tensor_parallel_size)
        if engine_key not in by_key:
            by_key[engine_key] = cost_mod.Roofline(acc, shape, pool.tensor_parallel_size)
        engine = by_key[engine_key]
        agent = job.placement.pool_agents[pool.name]
        engines.setdefault(agent, {})[pool.name] = (engine, config.max_seqs)
        pools[pool.name] = Pool(agent, pool.tensor_parallel_size, acc.name)
        members = []
        for _ in range(pool.replicas):
            idx = len(workers)
            w = entities.Worker(
                idx=idx,
                worker_id=f"w{idx:0{width}d}",
                pool=pool.name,
                engine=engine,
                max_seqs=config.max_seqs,
                kv_capacity=kv,
                order=order,
            )
            workers.append(w)
            members.append(w)
        pool_workers[pool.name] = members
    colocated = config.system.colocated
    return Layout(
        config=job,
        workers=workers,
        pool_workers=pool_workers,
        pools=pools,
        engines=engines,
        tasks=_tasks(config, job),
        shape0=config.models[spec.agents[0].name],
        train_gpus=(
            sum(len(ws) * pools[p].tp for p, ws in pool_workers.items())
            if colocated
            else config.training.gpus
        ),
        train_acc=(
            costmodel.accelerator(pools[spec.pools[0].name].accelerator)
            if colocated
            else config.training.accelerator
        ),
    )


def _tasks(config: scenario.RunConfig, job: jobconfig.JobConfig) -> list[Task]:
    system = config.system
    tasks: list[Task] = []
    for task in job.scheduler.tasks:
        load = config.workloads[task.name]
        agents = task.agents or (task.agent,)
        placement = job.placement.tasks[task.name]
        restricted = set(placement.pools)
        work: str | None = None
        if system.affinity:
            profile = costmodel.TaskProfile(**workloads.mean_profile(load))
            work = affinity.resolve(placement.affinity, profile, shape=config.models[agents[0]])
        eligible: dict[str, tuple[str, ...]] = {}
        for agent in agents:
            mine = {
                pool: preferred
                for pool, preferred in job.placement.pools.items()
                if job.placement.pool_agents[pool] == agent and (not restricted or pool in restricted)
            }
            if not mine:
                raise errors.SpecError(
                    f"no pool serves agent {agent}", field=f"spec.tasks.{task.name}.agents"
                )
            pools = affinity.eligible_pools(work, mine) if work else sorted(mine)
            eligible[agent] = tuple(pools)
        tasks.append(
            Task(
                name=task.name,
                agents=agents,
                eligible=eligible,
                workload=load,
                group_size=task.group_size,
                # The members the live scheduler starts per group, when the system honours redundancy.
                launched=task.members if system.redundancy else task.group_size,
                weight=job.buffer.task_weights[task.name],
                reward_kind=load.reward_kind,
                work=work,
            )
        )
    return tasks


def _turn_cost(
    engine: cost_mod.EngineCost, max_seqs: int, context: int, cached: int, added: int, out: int
) -> tuple[float, float]:
    """(latency alone, work share at full batch) of one turn on a worker with ``engine``."""
    new = context - cached + added
    flops = engine.prefill_flops(new, cached)
    prefill = engine.prefill_batch(flops=flops, kv_tokens=context + added, new_tokens=new)
    mean_ctx = context + added + out / 2
    alone = prefill + out * engine.decode_step(1, mean_ctx)
    # work: prefill at a large packed batch (per-step overhead and weight read amortised away)
    packed = engine.prefill_batch(
        flops=flops * max_seqs, kv_tokens=(context + added) * max_seqs, new_tokens=new * max_seqs
    )
    shared = out * engine.decode_step(max_seqs, mean_ctx * max_seqs) / max_seqs
    return alone, packed / max_seqs + shared
