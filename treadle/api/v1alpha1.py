"""RolloutJob ``treadle.dev/v1alpha1``: the typed spec and status, the one source of the CRD.

Callers: the operator (reads ``spec``, writes ``status``), ``treadle run FILE`` and the simulator
(select policies from ``spec.rollout``, routing from ``spec.tasks[].affinity`` and
``spec.pools[].preferredWork``), and ``treadle.api.crd`` (generates the CRD from these classes).

Field docstrings become the CRD's ``description``s. Each cross-field rule is declared once in
``treadle.api.spec_rules``, as a CEL expression for the API server *and* a Python predicate for
``parse_spec``, and a test feeds the same invalid manifests to both.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Annotated, Any, Final, Literal

import pydantic
from pydantic import Field

from treadle import errors
from treadle.api import base, external, spec_rules
from treadle.api import dataset as dataset_api
from treadle.api import engine as engine_api
from treadle.api import progress as progress_api
from treadle.api import sampling as sampling_
from treadle.api import trainer as trainer_api
from treadle.policy import baselines, registry
from treadle.policy.flexmarl import load_balance

GROUP = "treadle.dev"
VERSION = "v1alpha1"
API_VERSION: Final = "treadle.dev/v1alpha1"
KIND: Final = "RolloutJob"
PLURAL = "rolloutjobs"
REWARD_DEMAND_ANNOTATION = "treadle.dev/reward-demand"
"""Scoring requests waiting or in flight, written on the job by its scheduler; sizes the reward gateway."""
FEEDER_PROBLEM_ANNOTATION = "treadle.dev/feeder-problem"
"""Why the job's feeder cannot feed (a dataset it cannot read, the message naming
``spec.tasks[i].dataset...``), written on the job by the feeder and removed once it reads them all;
the operator reports it as ``Degraded`` (reason ``DatasetUnusable``)."""
SINGULAR = "rolloutjob"
SHORT_NAMES = ("rj",)
# Children are named ``<job>-<component>`` and ``<job>-pool-<pool>``; Service names must stay
# DNS-1035 labels (<= 63), hence the bounds on job and pool names.
MAX_JOB_NAME = 40
MAX_POOL_NAME = 16
MANAGER = "treadle.dev/operator"
"""The ``managedBy`` value (or its absence) under which the Treadle operator reconciles a job."""

# The shared wire conventions and Kubernetes-shaped types, under the names this module always had
# (``treadle.api.base`` holds them so that ``treadle.api.trainer`` can use them too).
DNS_LABEL = base.DNS_LABEL
USER_CODE = "py:"
"""Prefix of user code an environment or reward names: ``py:<module>:<attribute>``."""
JUDGE = external.JUDGE
REWARD_FN = (
    r"^([a-z]([-a-z0-9]*[a-z0-9])?|py:[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*"
    r"|judge:[a-z]([-a-z0-9]*[a-z0-9])?)$"
)
QUANTITY = base.QUANTITY
Name = base.Name
Quantity = base.Quantity
Accelerator = base.Accelerator
WorkAffinity = Literal["prefill-heavy", "decode-heavy", "auto"]
PreferredWork = Literal["prefill-heavy", "decode-heavy", "any"]
RewardType = Literal["rule", "code", "llm-judge", "external"]
WeightStore = Literal["mooncake", "local"]
RebalanceRule = Literal["per-instance", "literal"]
Dtype = Literal["auto", "bfloat16", "float16", "float32"]
Phase = Literal["Pending", "Progressing", "Ready", "Degraded", "Suspended"]
ConditionType = Literal["Ready", "Progressing", "Degraded", "Suspended"]

VLLM_VERSION = base.VLLM_VERSION
DEFAULT_VLLM_IMAGE = base.DEFAULT_VLLM_IMAGE
DEFAULT_ENV_IMAGE = "ghcr.io/treadle-dev/treadle-env:0.1.0"


class _Model(base.Model):
    """The spec's wire conventions (``base.Model``): camelCase, unknown fields refused, frozen."""


Toleration = base.Toleration


class Agent(_Model):
    """One policy model. A single agent is the common case; several make a FlexMARL multi-agent job."""

    name: Name
    """Agent name, referenced by ``pools[].agent`` and ``tasks[].agents``; immutable."""
    model: str = Field(min_length=1, max_length=512)
    """Model to serve: a Hugging Face id or a path inside the image; immutable."""
    image: str = Field(default=DEFAULT_VLLM_IMAGE, min_length=1, max_length=512)
    """Inference image (official vLLM plus the Treadle worker extension)."""
    max_model_len: int = Field(default=32768, ge=256, le=1048576)
    """Maximum context length (prompt plus response) in tokens, passed to vLLM."""
    dtype: Dtype = "bfloat16"
    """Weight and activation dtype, passed to vLLM (``float32`` for vLLM's CPU build)."""


class Pool(_Model):
    """An inference pool: replicas of one agent on one accelerator class."""

    name: Annotated[str, Field(min_length=1, max_length=MAX_POOL_NAME, pattern=DNS_LABEL)]
    """Pool name, unique in the job; children are named ``<job>-pool-<name>``."""
    agent: Name
    """The agent (``agents[].name``) this pool serves; immutable."""
    accelerator: Accelerator
    """Accelerator class; selects nodes labelled ``treadle.dev/accelerator=<value>``; immutable."""
    node_selector: dict[str, str] = Field(default_factory=dict, max_length=16)
    """Extra node labels the pool's pods require, merged over the accelerator selector."""
    tolerations: list[Toleration] = Field(default_factory=list, max_length=16)
    """Extra tolerations; the ``nvidia.com/gpu`` taint is always tolerated."""
    replicas: int = Field(default=1, ge=0, le=512)
    """Inference replicas (vLLM servers) in the pool."""
    tensor_parallel_size: Literal[1, 2, 4, 8] = 1
    """GPUs per replica (tensor parallelism); each pod asks this many ``nvidia.com/gpu``."""
    preferred_work: PreferredWork = "any"
    """Work this pool is tuned for (RollArt: H800 prefill-heavy, H20 decode-heavy)."""
    engine: engine_api.Engine = Field(default_factory=engine_api.Engine)
    """Overrides of the engine container (arguments, environment, resources)."""


class Task(_Model):
    """A task domain: which agents act, in which environment, with which reward."""

    name: Name
    """Task name, unique in the job; the tag trajectories carry for routing."""
    agents: list[Name] = Field(min_length=1, max_length=8)
    """Agents acting in this task, in turn order (one for single-agent RL)."""
    environment: str = Field(min_length=1, max_length=253, pattern=REWARD_FN)
    """Environment served by the env pool: a built-in (``math-tool``, ``python-code``, ``frozenlake``) or
    a user environment ``py:<module>:<Class>`` under a module prefix the env pool allows."""
    reward: str = Field(min_length=1, max_length=253, pattern=REWARD_FN)
    """Reward function served by the reward gateway: a built-in (``math``, ``exact``, ``code-tests``,
    ``llm-judge``, ``env``, ``letter-fraction``) or a user function ``py:<module>:<function>`` under a
    module prefix the gateway allows."""
    affinity: WorkAffinity = "auto"
    """Hardware affinity; ``auto`` lets the cost model decide from the measured task profile."""
    pools: list[Name] = Field(default_factory=list, max_length=16)
    """Restrict the task to these pools; empty routes by affinity over all pools of its agents."""
    group_size: int = Field(default=8, ge=1, le=1024)
    """Trajectories per prompt group (GRPO group size n)."""
    redundancy: float = Field(default=0.0, ge=0.0, le=4.0)
    """Extra trajectories started per group, as a fraction of ``groupSize`` (sampling mode ``redundant``)."""
    sampling: sampling_.Sampling = Field(default_factory=sampling_.Sampling)
    """How each prompt's group is sampled: ``standard``, ``redundant`` or ``darts`` (docs/DARTS.md)."""
    max_turns: int = Field(default=16, ge=1, le=1024)
    """Turn limit per trajectory."""
    stop: list[Annotated[str, Field(min_length=1, max_length=64)]] = Field(
        default_factory=list, max_length=16
    )
    """Stop sequences of every generation (the engine's ``stop``): a turn ends at the first one, which
    is left out of the text (a finished completion, ``finish_reason`` ``stop``, not a truncated one)."""
    weight: float = Field(default=1.0, gt=0.0, le=1000.0)
    """Relative share of this task in a training batch."""
    dataset: dataset_api.Dataset | None = None
    """Rows the task's prompts come from (fed by the job's feeder); unset: environment seeds."""


ApiQuota = external.ApiQuota
RewardModel = external.RewardModel
ExternalResources = external.ExternalResources


class Environment(_Model):
    """The CPU pool that runs environment sessions (tool calls, sandboxes, games)."""

    image: str = Field(default=DEFAULT_ENV_IMAGE, min_length=1, max_length=512)
    """Environment sandbox image."""
    resources: base.Resources = base.Resources(
        requests=base.ResourceList(cpu="2", memory="4Gi"), limits=base.ResourceList(cpu="2", memory="4Gi")
    )
    """Each environment pod's CPU and memory; unset: 2 CPU and 4Gi, requested and limited (limits keep
    model-written code from taking the node)."""
    replicas: int = Field(default=2, ge=0, le=4096)
    """Environment pods."""
    warm_pool: int = Field(default=0, ge=0, le=64)
    """Pre-started sessions kept ready per pod, so ``env.reset`` does not sit on the critical path.
    python-code keeps that many sandbox processes started (interpreter, namespaces, limits) for its
    attempts; math-tool and frozenlake open from the seed in microseconds and pre-start nothing."""


class Reward(_Model):
    """The reward gateway: scale-to-zero scoring of finished trajectories (RollArt serverless reward)."""

    type: RewardType = "rule"
    """rule / code (sandboxed) / llm-judge / external (call ``url``)."""
    url: str | None = Field(default=None, max_length=2048, pattern=r"^https?://")
    """Endpoint of an external reward service; required when type is external."""
    judge_model: str | None = Field(default=None, max_length=512)
    """Judge model for type llm-judge; required then."""
    min_replicas: int = Field(default=0, ge=0, le=256)
    """Gateway replicas kept when idle; must be 0 when scaleToZero is true."""
    max_replicas: int = Field(default=4, ge=1, le=256)
    """Gateway replicas at most, under load."""
    scale_to_zero: bool = True
    """Scale the gateway to zero replicas when no trajectory is being scored."""


def _enum(names: Iterable[str]) -> dict[str, pydantic.JsonValue]:
    """The CRD's enum for a name the model checks itself (``Literal`` would not take a context)."""
    return {"enum": list[pydantic.JsonValue](sorted(names))}


class Rebalance(_Model):
    """Inter-agent rebalancing (FlexMARL): placement moves inference workers from a lightly loaded
    agent to a heavily loaded one of the same instance shape (model, TP, accelerator); a moved worker
    drains, loads the receiver's weights, then serves the receiver."""

    enabled: bool | None = None
    """Move workers between agents; unset: on when two or more agents have pools of one shape."""
    delta: float = Field(default=load_balance.DEFAULT_DELTA, ge=0.0, le=1_000_000.0)
    """Queue disparity above which workers move (FlexMARL: 5); per worker under per-instance."""
    rule: RebalanceRule = "per-instance"
    """per-instance: compare queued turns per worker (settles); literal: the paper's queued turns."""
    interval_seconds: float = Field(default=1.0, ge=0.05, le=3600.0)
    """Seconds between placement's measurements of every agent's queue."""
    max_moves_per_poll: int = Field(default=1, ge=0, le=512)
    """Workers moved per measurement at most; 0: as many as the rule asks for at once."""
    settle_polls: int = Field(default=5, ge=0, le=1000)
    """Measurements skipped after a move, while the turns already queued on the moved worker drain."""


class Rollout(_Model):
    """How trajectories are admitted, scheduled and placed."""

    batch_size: int = Field(default=64, ge=1, le=65536)
    """Trajectories per training batch."""
    staleness: int = Field(default=1, ge=0, le=64)
    """Staleness bound alpha: a trajectory may be at most this many policy versions behind."""
    scheduling_policy: str = Field(
        default=registry.DEFAULT_SCHEDULING, json_schema_extra=_enum(registry.SCHEDULING_POLICIES)
    )
    """Name of the turn scheduling policy in ``treadle.policy.registry``."""
    placement_policy: str = Field(
        default=registry.DEFAULT_PLACEMENT, json_schema_extra=_enum(registry.PLACEMENT_POLICIES)
    )
    """Name of the worker placement policy in ``treadle.policy.registry``."""
    rebalance: Rebalance = Field(default_factory=Rebalance)
    """Inter-agent rebalancing of a multi-agent job: moving workers to the agent with the longer queue."""

    @pydantic.field_validator("scheduling_policy", "placement_policy")
    @classmethod
    def _served(cls, name: str, info: pydantic.ValidationInfo) -> str:
        """The names the live services serve (the CRD's enum); a simulation also takes the baselines.

        The simulator replays the papers' baselines (``treadle.policy.baselines``), which no live
        service serves, so ``parse_job(..., simulation=True)`` accepts them and nothing else does.
        """
        placement = info.field_name == "placement_policy"
        known = set(registry.PLACEMENT_POLICIES if placement else registry.SCHEDULING_POLICIES)
        if placement and info.context and info.context.get(SIMULATION):
            known |= set(baselines.PLACEMENT_POLICIES)
        if name not in known:
            raise ValueError(f"Unsupported value: {name!r}: supported values: {sorted(known)}")
        return name


class Weights(_Model):
    """Where published policy weights live."""

    store: WeightStore = "mooncake"
    """mooncake (store pods, pulled by workers) or local (single-node development); immutable."""
    replicas: int = Field(default=2, ge=1, le=16)
    """Copies of each published version in the store; local allows only 1."""


class Feeder(_Model):
    """The job's feeder: one pod that reads every dataset task's rows and keeps the scheduler supplied
    (rendered only when a task has a ``dataset``)."""

    volumes: list[dataset_api.Volume] = Field(default_factory=list, max_length=8)
    """Volumes mounted into the feeder's pod; every ``path`` source lies under one's ``mountPath``."""
    hugging_face_cache: str | None = Field(
        default=None, min_length=2, max_length=4096, pattern=dataset_api.MOUNT_PATH
    )
    """The Hugging Face hub cache ``huggingFace`` sources are read from, under one of ``volumes``;
    unset: the image's default cache (``HF_HUB_CACHE``)."""
    resources: base.Resources = base.Resources(
        requests=base.ResourceList(cpu="500m", memory="2Gi"), limits=base.ResourceList(memory="2Gi")
    )
    """The feeder's CPU and memory (it holds every dataset's rows); unset: requests 500m and 2Gi,
    memory limit 2Gi."""


class CpuPlacement(_Model):
    """Where the job's CPU pods run: environments, the reward gateway (without GPUs), the
    coordination services and the feeder."""

    avoid_gpu_nodes: bool = True
    """Require nodes that are not GPU nodes: no ``nvidia.com/gpu.present`` label (NVIDIA GPU feature
    discovery) and no GPU class in ``treadle.dev/accelerator``; CPU nodes need no label at all.
    False: only ``nodeSelector`` and ``tolerations`` decide."""
    node_selector: dict[str, str] = Field(default_factory=dict, max_length=16)
    """Node labels the CPU pods require."""
    tolerations: list[Toleration] = Field(default_factory=list, max_length=16)
    """Tolerations of the CPU pods (none by default: no GPU taint is tolerated)."""


class Placement(_Model):
    """Node placement of the job's pods beyond the inference pools' accelerators."""

    cpu: CpuPlacement = Field(default_factory=CpuPlacement)
    """The CPU pods."""


class RolloutJobSpec(_Model):
    """Desired state of a RolloutJob."""

    agents: list[Agent] = Field(min_length=1, max_length=8)
    """Policy models; one for single-agent RL, several for FlexMARL-style multi-agent RL."""
    pools: list[Pool] = Field(min_length=1, max_length=16)
    """Inference pools; every agent needs at least one."""
    tasks: list[Task] = Field(min_length=1, max_length=32)
    """Task domains trained together."""
    external_resources: ExternalResources = Field(default_factory=ExternalResources)
    """Per-action resources: API quotas, reward-model GPUs, CPU per action."""
    environment: Environment = Field(default_factory=Environment)
    """The CPU environment pool."""
    reward: Reward = Field(default_factory=Reward)
    """The reward gateway."""
    rollout: Rollout = Field(default_factory=Rollout)
    """Admission, scheduling and placement settings."""
    weights: Weights = Field(default_factory=Weights)
    """Weight publication."""
    feeder: Feeder = Field(default_factory=Feeder)
    """The pod feeding dataset tasks' rows (volumes, Hugging Face cache, memory)."""
    placement: Placement = Field(default_factory=Placement)
    """Node selection of the CPU pods."""
    trainer: trainer_api.Trainer | None = None
    """The job's own trainer (a batch/v1 Job); unset: a trainer outside the job drives it."""
    suspend: bool = False
    """Scale every child to zero while true; resuming restores the spec's replicas."""
    managed_by: str | None = Field(default=None, max_length=63, pattern=r"^[a-z0-9.-]+/[a-z0-9.-]+$")
    """Controller that reconciles this job; unset or ``treadle.dev/operator`` means Treadle. Immutable."""


class Condition(_Model):
    """A metav1.Condition."""

    type: ConditionType
    """Ready, Progressing, Degraded or Suspended."""
    status: Literal["True", "False", "Unknown"]
    """Whether the condition holds."""
    reason: str = Field(max_length=128, pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
    """Machine-readable CamelCase reason (see ``treadle.operator.reasons``)."""
    message: str = Field(default="", max_length=32768)
    """Human-readable detail."""
    last_transition_time: str
    """When ``status`` last changed (RFC 3339)."""
    observed_generation: int = Field(default=0, ge=0)
    """The ``metadata.generation`` this condition was computed from."""


class PoolStatus(_Model):
    """Observed state of one inference pool."""

    name: str = Field(max_length=MAX_POOL_NAME)
    """Pool name."""
    accelerator: str = Field(max_length=32)
    """Accelerator class."""
    desired: int = Field(ge=0)
    """Replicas asked for (0 while suspended)."""
    ready: int = Field(ge=0)
    """Replicas ready."""
    gpus: int = Field(ge=0)
    """GPUs the pool asks for (desired x tensorParallelSize)."""


TrainerStatus = trainer_api.TrainerStatus
ReasonCount = progress_api.ReasonCount
RolloutProgress = progress_api.RolloutProgress


class RolloutJobStatus(_Model):
    """Observed state of a RolloutJob: written by the operator, except ``policyVersion``, ``step``,
    ``meanReward`` and ``rollout``, which the job's scheduler writes."""

    observed_generation: int = Field(default=0, ge=0)
    """The ``metadata.generation`` the status reflects."""
    phase: Phase = "Pending"
    """Summary of the conditions for printer columns; read ``conditions`` for decisions."""
    conditions: list[Condition] = Field(default_factory=list, max_length=8)
    """Ready, Progressing, Degraded, Suspended."""
    pools: list[PoolStatus] = Field(default_factory=list, max_length=16)
    """Per-pool ready/desired replicas."""
    pools_ready: str = Field(default="0/0", max_length=16)
    """Pools with every replica ready, as ``ready/total`` (printer column)."""
    policy_version: int = Field(default=0, ge=0)
    """Latest committed policy (weights) version."""
    step: int = Field(default=0, ge=0)
    """Training steps completed."""
    mean_reward: float | None = None
    """Mean reward of the batch the latest committed version was trained on (printer column)."""
    rollout: RolloutProgress | None = None
    """The rollout as the job's scheduler counts it (None until it first reports)."""
    trainer: TrainerStatus | None = None
    """The trainer group's pods (only with ``spec.trainer``)."""


SIMULATION = "simulation"
"""Validation context key: the job is simulated, so the simulator's baseline policies are allowed."""


def parse_spec(raw: Mapping[str, Any], *, simulation: bool = False) -> RolloutJobSpec:
    """Validate a ``spec`` mapping (camelCase, as stored) into the typed spec.

    Raises ``SpecError`` whose ``field`` is the dotted path from ``spec``; the same inputs the API
    server rejects through the CRD schema and its CEL rules are rejected here with the same message.
    Its ``problems`` are all of them: every schema error, else every duplicate and broken rule.
    ``simulation`` also accepts the simulator's baseline placement policies.
    """
    try:
        spec = RolloutJobSpec.model_validate(raw, context={SIMULATION: simulation})
    except pydantic.ValidationError as exc:
        raise errors.SpecError.gather(base.schema_errors("spec", exc)) from exc
    if found := spec_rules.problems(spec):
        raise errors.SpecError.gather(found)
    return spec


class RolloutJob(_Model):
    """A whole RolloutJob object (``metadata`` kept as the raw mapping)."""

    api_version: Literal["treadle.dev/v1alpha1"] = Field(default=API_VERSION, alias="apiVersion")
    kind: Literal["RolloutJob"] = KIND
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: RolloutJobSpec
    status: RolloutJobStatus = Field(default_factory=RolloutJobStatus)

    @property
    def name(self) -> str:
        return str(self.metadata.get("name", ""))

    @property
    def namespace(self) -> str:
        return str(self.metadata.get("namespace", "default"))


def parse_job(raw: Mapping[str, Any], *, simulation: bool = False) -> RolloutJob:
    """Validate a whole RolloutJob object; ``SpecError.field`` is rooted at the object, and its
    ``problems`` are every problem of the object (kind, name, spec, status), in that order."""
    if not isinstance(raw, Mapping):
        raise errors.SpecError(
            "a RolloutJob is a mapping (apiVersion, kind, metadata, spec)", field="<document>", value=raw
        )
    found: list[errors.SpecError] = []
    if raw.get("apiVersion") != API_VERSION or raw.get("kind") != KIND:
        found.append(
            errors.SpecError(
                f"expected apiVersion {API_VERSION} and kind {KIND}",
                field="apiVersion",
                value=(raw.get("apiVersion"), raw.get("kind")),
            )
        )
    metadata = raw.get("metadata") or {}
    if not isinstance(metadata, Mapping):
        found.append(
            errors.SpecError("must be a mapping (name, namespace, ...)", field="metadata", value=metadata)
        )
        metadata = {}
    name = str(metadata.get("name", ""))
    if not re.match(DNS_LABEL, name) or len(name) > MAX_JOB_NAME:
        found.append(
            errors.SpecError(
                f"must be a DNS-1035 label of at most {MAX_JOB_NAME} characters",
                field="metadata.name",
                value=name,
            )
        )
    try:
        spec = parse_spec(raw.get("spec") or {}, simulation=simulation)
    except errors.SpecError as exc:
        found.append(exc)
    try:
        status = RolloutJobStatus.model_validate(raw.get("status") or {})
    except pydantic.ValidationError as exc:
        found += base.schema_errors("status", exc)
    if found:
        raise errors.SpecError.gather(found)
    return RolloutJob(metadata=dict(metadata), spec=spec, status=status)
