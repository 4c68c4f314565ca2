"""The one translation of a RolloutJob into each service's typed configuration.

Called by ``treadle.services.podenv`` (a service started from the job file the operator mounts),
by ``treadle.localmode`` (which writes the same job file and starts its services the same way) and
by the tests that hold the two equal. A job setting reaches a service only through here: the
operator renders the spec once (``job_file`` into the job's ConfigMap) and no ``TREADLE_*`` variable
repeats a spec field (``treadle.api.env_vars``). What only the caller knows (tokens per turn, the
in-flight window, generations at once) comes in as arguments.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Sequence

from treadle.api import dataset as dataset_api
from treadle.api import sampling, v1alpha1
from treadle.api import trainer as trainer_api
from treadle.api.sampling import Length
from treadle.errors import SpecError
from treadle.policy import affinity, registry
from treadle.policy.flexmarl import load_balance
from treadle.policy.tangram import quota

REWARD_COLD_START_S = 180.0
"""How long the scheduler waits out an unavailable reward gateway that can scale to zero (a pod's
scheduling, image pull and start, with margin) before failing a trajectory."""
REWARD_RESTART_S = 90.0
"""How long the scheduler waits out an unavailable reward gateway that is always on: its pod was
deleted, crashed or moved, and the replacement starts (found on the dev cluster: with the gateway's
pod deleted, 108 trajectories failed within seconds on four quick attempts)."""
WORKER_START_S = 900.0
"""How long a turn waits for a ready inference worker: the inference pods' startup probe allows
vLLM 900 s to load a model (found on the dev cluster: the feeder's first groups failed while vLLM
was loading)."""
ENV_START_S = 120.0
"""How long a session's open waits for the job's env pool to have a ready pod (found on the dev
cluster: the feeder's first groups failed while the env pod was still starting)."""


@dataclasses.dataclass(frozen=True)
class TaskConfig:
    """One task domain as the scheduler runs it."""

    name: str
    env: str
    agent: str = "default"
    """The agent of a single-agent task; its first agent otherwise (the trajectory's record agent)."""
    agents: tuple[str, ...] = ()
    """Several agents in turn order (FlexMARL): turn k is ``agents[k % len(agents)]``'s, served by
    a worker of that agent's pools and stored in that agent's experience table. Empty: every turn is
    ``agent``'s (placement and the buffer see no agent per turn)."""
    reward_fn: str = ""
    """Reward function; empty takes the one the environment names in ``info["reward_fn"]``."""
    group_size: int = 8
    redundancy: float = 0.0
    """Extra members started per group as a fraction of ``group_size`` (the DARTS seam: the buffer
    receives them all; selecting ``group_size`` of them is DARTS's job)."""
    sampling: str = "standard"
    """The sampling mode in force (``treadle.api.sampling``): ``standard``, ``redundant`` or ``darts``.
    The DARTS settings below are 0 (false, ``tokens``) in the other modes."""
    m_up: int = 0
    long_end: int = 0
    lam: float = 0.0
    ema_decay: float = 0.0
    keep_unselected: bool = False
    length: Length = "tokens"
    max_turns: int = 8
    max_tokens: int = 256
    temperature: float = 1.0
    stop: tuple[str, ...] = ()
    """Stop sequences every generation request carries (vLLM's ``stop``)."""
    system_prompt: str = ""

    def __post_init__(self) -> None:
        if len(self.agents) == 1 or len(set(self.agents)) != len(self.agents):
            raise SpecError(
                "several distinct agents, or none", field=f"tasks.{self.name}.agents", value=self.agents
            )
        if self.agents and self.agent != self.agents[0]:
            raise SpecError("must be the first of agents", field=f"tasks.{self.name}.agent", value=self.agent)

    @property
    def members(self) -> int:
        return self.group_size + int(self.redundancy * self.group_size + 0.999999)

    def agent_of(self, turn: int) -> str:
        """The agent acting at ``turn`` (0-based); empty for a single-agent task."""
        return self.agents[turn % len(self.agents)] if self.agents else ""


@dataclasses.dataclass(frozen=True)
class Settings:
    """The scheduler's admission, retry and scheduling knobs (all counts in trajectories)."""

    alpha: int = 1
    batch_size: int = 64
    max_in_flight: int = 1024
    max_pending_trajectories: int = 1_000_000
    max_concurrent_generations: int = 1_000_000
    """Turns generating at once; when more wait, ``scheduling_policy`` orders them."""
    worker_slots: int = 0
    """If > 0: at most this many turns generate at once on each worker (its engine's running batch),
    each worker with its own queue ordered (and, if preemptive, preempted) by the scheduling policy
    -- Heddle's per-worker progressive priority; a turn is then assigned before it waits.
    ``max_concurrent_generations`` applies only when this is 0."""
    scheduling_policy: str = registry.DEFAULT_SCHEDULING
    preemption_margin: float = 0.0
    """Preemptive policies only: a waiting turn preempts a running one when its predicted remaining
    work exceeds the running one's by more than this fraction (0: Heddle's Algorithm 1)."""
    preemption_max_progress: float = 0.25
    """Preemptive policies only: a running turn is preempted only while it has held its slot for at
    most this fraction of a typical turn (the gate's running mean). The agent drops an aborted
    turn's tokens, so this bounds the work a preemption throws away; ``inf``: Algorithm 1 unbounded."""
    env_attempts: int = 4
    reward_attempts: int = 4
    generation_attempts: int = 3
    backoff_s: float = 0.05
    """First retry delay; doubles per attempt up to ``max_backoff_s``."""
    max_backoff_s: float = 2.0
    reward_unavailable_s: float = 0.0
    """If > 0: the reward gateway may be unavailable (``Unavailable``: no endpoint, as while a gateway
    scaled to zero starts its first pod, tens of seconds) for this long before a trajectory fails;
    until then ``Unavailable`` is retried with backoff capped at ``max_backoff_s`` beyond
    ``reward_attempts``. Timeouts and other errors still count against ``reward_attempts``. Set by
    ``job_config``: a cold start's budget when the gateway can scale to zero, else a pod restart's."""
    env_open_unavailable_s: float = 0.0
    """If > 0: opening an environment session waits out ``Unavailable`` (no env pod ready yet: a
    job's pods start together, and the scheduler takes prompts before its env pool is ready) this
    long, as ``reward_unavailable_s`` does; steps still fail after ``env_attempts``. Set by
    ``job_config``."""
    worker_unavailable_s: float = 0.0
    """If > 0: a turn waits this long for placement to have a ready inference worker (``Unavailable``:
    engines still loading, or all restarting) before its trajectory fails. Set by ``job_config``."""
    buffer_put_max: int = 256
    """Finished trajectories put to the buffer in one call at most."""


@dataclasses.dataclass(frozen=True)
class TaskPlacement:
    """What placement needs of one task: its declared affinity and an optional pool restriction."""

    affinity: str = affinity.AUTO
    pools: Sequence[str] = ()


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
class SchedulerConfig:
    tasks: list[TaskConfig]
    settings: Settings


@dataclasses.dataclass(frozen=True)
class PlacementConfig:
    pools: dict[str, str]
    """Pool -> preferred work (placement's hardware affinity)."""
    tasks: dict[str, TaskPlacement]
    policy: str
    rebalance: RebalanceConfig
    """Inter-agent rebalancing (off unless the job has two agents of one shape)."""
    pool_agents: dict[str, str]
    """Pool -> the agent it serves (per-agent turns and inter-agent rebalancing)."""
    pool_shapes: dict[str, str]
    """Pool -> instance shape (model, TP, accelerator): rebalancing moves workers only within one."""
    alpha: int
    """``spec.rollout.staleness``: no turn goes to a worker more than this many versions behind its
    agent's target (weight sync)."""


@dataclasses.dataclass(frozen=True)
class BufferConfig:
    alpha: int
    task_weights: dict[str, float]
    agents: list[str]
    """Agents the micro-batch pipeline updates together: every policy of a multi-agent job
    (FlexMARL), none for a single policy (the barrier then spans whoever streams)."""


@dataclasses.dataclass(frozen=True)
class EnvConfig:
    environments: frozenset[str]
    """The environments the job's tasks name (a pod refuses to start without all of them)."""
    user_modules: tuple[str, ...]
    """Modules of the job's user environments (``py:<module>:<Class>``): the only ones the env service
    imports user code from, besides its ``--allow-user-module`` prefixes."""
    warm_pool: int
    """``spec.environment.warmPool`` (the env service keeps none when no task runs python-code)."""
    cpu_per_action: str
    """``spec.externalResources.cpuCoresPerAction``, a Kubernetes CPU quantity: the most cores the
    pod's action manager grants one action (``treadle.sandbox.cores``)."""
    api_quotas: dict[str, quota.Limit] = dataclasses.field(default_factory=dict)
    """``spec.externalResources.apiQuotas`` by tool, as enforced across the env pods (``quota.limit``)."""


@dataclasses.dataclass(frozen=True)
class RewardConfig:
    judge_url: str | None
    """``spec.reward.url`` of an ``llm-judge`` job."""
    external_url: str | None
    """``spec.reward.url`` of an ``external`` job (every request forwarded there)."""
    judge_model: str | None
    user_modules: tuple[str, ...]
    """Modules of the job's user reward functions (``py:<module>:<function>``), allowed as the env
    service allows its user environments' (``EnvConfig.user_modules``)."""
    cpu_per_action: str = "1"
    """``spec.externalResources.cpuCoresPerAction``: the most cores a sandboxed reward run
    (``code-tests``) is granted by the gateway pod's action manager, as in the env pods."""
    models: tuple[v1alpha1.RewardModel, ...] = ()
    """``spec.externalResources.rewardModels``: served on the gateway's own GPUs (``judge:<name>``)."""
    gpus: int = 0
    """``spec.externalResources.rewardModelGpus``: GPUs of each gateway replica."""
    gpu_memory_gb: float = 80.0
    """``spec.externalResources.rewardModelGpuMemoryGb``."""


@dataclasses.dataclass(frozen=True)
class FeedTask:
    """A task as the feeder feeds it: a dataset's rows, or its environment's seeds."""

    index: int
    """The task's index in ``spec.tasks`` (errors name ``spec.tasks[index].dataset``)."""
    name: str
    dataset: dataset_api.Dataset | None
    """None: the task draws its prompts from its environment's seeds 0, 1, 2, ... (``feeding.Seeds``)."""
    members: int
    """Trajectories per group (group size plus redundancy), as the scheduler counts them."""
    weight: float


@dataclasses.dataclass(frozen=True)
class FeederConfig:
    tasks: tuple[FeedTask, ...]
    """Every task of the job, in ``spec.tasks`` order."""
    target_pending: int
    """Trajectories the feeder keeps waiting for admission: ``spec.rollout.batchSize``."""
    hf_cache: str | None
    """``spec.feeder.huggingFaceCache`` (None: the image's ``HF_HUB_CACHE``)."""


@dataclasses.dataclass(frozen=True)
class TrainerConfig:
    """The reference trainer of ``spec.trainer`` (``treadle.trainer.job``), with the job's rollout
    settings it must agree with."""

    agent: str
    """The trained agent."""
    model: str
    """The agent's model (a path, or a Hugging Face id in the local cache): what the engines serve."""
    steps: int
    batch_size: int
    """``spec.rollout.batchSize``: trajectories per training batch."""
    alpha: int
    """``spec.rollout.staleness``: the buffer evicts by it, and the store keeps ``alpha + 1`` versions."""
    lr: float
    clip_low: float
    clip_high: float
    temperature: float
    """The engines' sampling temperature (the trainer rescores token logprobs under it)."""
    threads: int | None
    batch_timeout_s: float
    weights_replicas: int
    """``spec.weights.replicas``: copies of each version the trainer writes to the store."""
    micro_batch_tokens: int | None = None
    activation_checkpointing: bool = False
    max_grad_norm: float | None = None
    bf16: bool = False
    """On GPUs (``spec.trainer.gpus`` > 0): bfloat16 compute over float32 parameters."""
    tracking: trainer_api.Tracking | None = None
    """``spec.trainer.tracking``: the experiment trackers rank 0 logs each step to
    (``treadle.trainer.tracking``); None: Prometheus only."""


def trainer_config(job: v1alpha1.RolloutJob, tasks: Sequence[TaskConfig]) -> TrainerConfig | None:
    """``spec.trainer`` as the reference trainer runs it; None for a job without one."""
    spec, trainer = job.spec, job.spec.trainer
    if trainer is None:
        return None
    agent = trainer.agent or spec.agents[0].name
    temperatures = {t.temperature for t in tasks if agent in (t.agent, *t.agents)}
    if len(temperatures) > 1:
        raise SpecError(
            f"the tasks of agent {agent!r} sample at different temperatures {sorted(temperatures)}; the "
            "reference trainer rescores under one",
            field="spec.trainer.agent",
            value=agent,
        )
    return TrainerConfig(
        agent=agent, model=next(a.model for a in spec.agents if a.name == agent), steps=trainer.steps,
        batch_size=spec.rollout.batch_size, alpha=spec.rollout.staleness, lr=trainer.learning_rate,
        clip_low=trainer.clip_low, clip_high=trainer.clip_high,
        temperature=temperatures.pop() if temperatures else TaskConfig(name="", env="").temperature,
        threads=trainer.threads, batch_timeout_s=trainer.batch_timeout_seconds,
        weights_replicas=spec.weights.replicas, micro_batch_tokens=trainer.micro_batch_tokens,
        activation_checkpointing=trainer.activation_checkpointing, max_grad_norm=trainer.max_grad_norm,
        bf16=trainer.gpus > 0, tracking=trainer.tracking,
    )  # fmt: skip


@dataclasses.dataclass(frozen=True)
class JobConfig:
    """What every service runs for a job, in local mode and in a cluster alike."""

    job: str
    scheduler: SchedulerConfig
    placement: PlacementConfig
    buffer: BufferConfig
    env: EnvConfig
    reward: RewardConfig
    feeder: FeederConfig
    trainer: TrainerConfig | None
    """``spec.trainer``; None when a trainer outside the job drives it."""


def job_file(job: v1alpha1.RolloutJob) -> str:
    """The validated spec as the job file every service reads (``job.json``; ``podenv.load_job``)."""
    return json.dumps(job.spec.model_dump(mode="json", by_alias=True, exclude_none=True), sort_keys=True)


def _task(t: v1alpha1.Task, *, max_tokens: int) -> TaskConfig:
    """One task's configuration; a ``darts`` task's settings come with their defaults filled in."""
    mode = t.sampling.resolved_mode(t.redundancy)
    darts = t.sampling.settings(t.group_size) if mode == "darts" else sampling.DartsSettings(0, 0, 0.0, 0.0)
    return TaskConfig(
        name=t.name, env=t.environment, agent=t.agents[0],
        agents=tuple(t.agents) if len(t.agents) > 1 else (), reward_fn=t.reward, group_size=t.group_size,
        redundancy=t.redundancy, sampling=mode, m_up=darts.m_up, long_end=darts.long_end, lam=darts.lam,
        ema_decay=darts.ema_decay, keep_unselected=darts.keep_unselected, length=darts.length,
        max_turns=t.max_turns, max_tokens=max_tokens, stop=tuple(t.stop),
    )  # fmt: skip


def job_config(
    job: v1alpha1.RolloutJob, *, max_tokens: int, max_in_flight: int, max_concurrent_generations: int
) -> JobConfig:
    """Every service's configuration for ``job``; the three counts are what only the caller knows."""
    spec = job.spec
    models = {a.name: a.model for a in spec.agents}
    tasks = [_task(t, max_tokens=max_tokens) for t in spec.tasks]
    settings = Settings(
        alpha=spec.rollout.staleness,
        batch_size=spec.rollout.batch_size,
        max_in_flight=max_in_flight,
        max_concurrent_generations=max_concurrent_generations,
        scheduling_policy=spec.rollout.scheduling_policy,
        # A gateway scaled to zero answers Unavailable until its first pod is ready, one always on
        # while a replacement of its pod starts, one with vLLM reward models while the engine of a
        # variant starts on its first grant on a chunk (as long as an inference engine may): wait that out.
        reward_unavailable_s=max(
            REWARD_COLD_START_S if spec.reward.scale_to_zero else REWARD_RESTART_S,
            WORKER_START_S if any(m.engine == "vllm" for m in spec.external_resources.reward_models) else 0.0,
        ),
        env_open_unavailable_s=ENV_START_S,
        worker_unavailable_s=WORKER_START_S,
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
        scheduler=SchedulerConfig(tasks=tasks, settings=settings),
        placement=PlacementConfig(
            pools={p.name: p.preferred_work for p in spec.pools},
            tasks={t.name: TaskPlacement(t.affinity, tuple(t.pools)) for t in spec.tasks},
            policy=spec.rollout.placement_policy,
            rebalance=rebalance_config(rebalance, enabled=enabled),
            pool_agents={p.name: p.agent for p in spec.pools},
            pool_shapes=pool_shapes,
            alpha=spec.rollout.staleness,
        ),
        buffer=BufferConfig(
            alpha=spec.rollout.staleness,
            task_weights={t.name: t.weight for t in spec.tasks},
            agents=[a.name for a in spec.agents] if len(spec.agents) > 1 else [],
        ),
        env=EnvConfig(
            environments=frozenset(t.environment for t in spec.tasks),
            user_modules=user_modules(t.environment for t in spec.tasks),
            warm_pool=spec.environment.warm_pool,
            cpu_per_action=spec.external_resources.cpu_cores_per_action,
            api_quotas=quota.limits(
                (q.tool, q.requests_per_minute, q.max_concurrent) for q in spec.external_resources.api_quotas
            ),
        ),
        reward=reward_config(
            spec.reward, user_modules(t.reward for t in spec.tasks), spec.external_resources
        ),
        feeder=feeder_config(spec),
        trainer=trainer_config(job, tasks),
    )


def feeder_config(spec: v1alpha1.RolloutJobSpec) -> FeederConfig:
    """The feeder's part of ``job_config`` (it needs none of the caller's counts)."""
    return FeederConfig(
        tasks=tuple(
            FeedTask(
                index=i, name=t.name, dataset=t.dataset, weight=t.weight,
                members=TaskConfig(name=t.name, env=t.environment, group_size=t.group_size,
                                   redundancy=t.redundancy).members,
            )
            for i, t in enumerate(spec.tasks)
        ),
        target_pending=spec.rollout.batch_size,
        hf_cache=spec.feeder.hugging_face_cache,
    )  # fmt: skip


def user_modules(names: Iterable[str]) -> tuple[str, ...]:
    """The modules of the user code (``py:<module>:<attribute>``) among ``names``, sorted, once each.

    The job's owner named them in its spec, so the services the job runs import exactly those:
    a spec-driven allowlist, where a request could name any module.
    """
    return tuple(sorted({n.removeprefix(v1alpha1.USER_CODE).split(":")[0]
                         for n in names if n.startswith(v1alpha1.USER_CODE)}))  # fmt: skip


def reward_config(
    reward: v1alpha1.Reward,
    modules: tuple[str, ...] = (),
    resources: v1alpha1.ExternalResources | None = None,
) -> RewardConfig:
    """``spec.reward.url`` goes to the endpoint its type uses (a rule job's is ignored)."""
    res = resources or v1alpha1.ExternalResources()
    return RewardConfig(
        judge_url=reward.url if reward.type == "llm-judge" else None,
        external_url=reward.url if reward.type == "external" else None,
        judge_model=reward.judge_model,
        user_modules=modules,
        cpu_per_action=res.cpu_cores_per_action,
        models=tuple(res.reward_models),
        gpus=res.reward_model_gpus,
        gpu_memory_gb=res.reward_model_gpu_memory_gb,
    )
