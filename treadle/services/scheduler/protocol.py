"""Scheduler configuration, the interfaces of its dependencies, its request and result types, and
validation of submitted work.

The service takes and returns these types; ``grpc_server`` converts them to and from protobuf (the
trajectories put to the buffer stay ``common_pb2.Trajectory``: the buffer's own input type).

Used by ``service.SchedulerService`` (dependencies are injected by keyword, as these ``Protocol``s,
so the gRPC clients and the in-process services are interchangeable) and by local mode, which
builds ``TaskConfig`` / ``Settings`` from a RolloutJob.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from treadle.errors import SpecError
from treadle.policy import registry
from treadle.services.agent import protocol as agent_protocol
from treadle.services.buffer import protocol as buffer_protocol
from treadle.services.env import protocol as env_protocol
from treadle.services.placement import protocol as placement_protocol
from treadle.services.reward import protocol as reward_protocol
from treadle.v1 import common_pb2

GROUP_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,150}$")
MAX_OPTIONS_BYTES = 64 * 1024


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
    max_turns: int = 8
    max_tokens: int = 256
    temperature: float = 1.0
    system_prompt: str = ""

    def __post_init__(self) -> None:
        if len(self.agents) == 1 or len(set(self.agents)) != len(self.agents):
            raise SpecError(
                "several distinct agents, or none", field=f"tasks.{self.name}.agents", value=self.agents
            )
        if self.agents and self.agent != self.agents[0]:
            raise SpecError("must be the first of agents", field=f"tasks.{self.name}.agent", value=self.agent)
        object.__setattr__(self, "agents", tuple(self.agents))  # JSON (``--tasks``) gives a list

    @property
    def members(self) -> int:
        return self.group_size + int(self.redundancy * self.group_size + 0.999999)

    def agent_of(self, turn: int) -> str:
        """The agent acting at ``turn`` (0-based); empty for a single-agent task."""
        return self.agents[turn % len(self.agents)] if self.agents else ""


@dataclasses.dataclass(frozen=True)
class Settings:
    """Admission, retry and scheduling knobs (all counts in trajectories)."""

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
    ``localmode.plan.job_config`` when the job's reward gateway can scale to zero."""
    buffer_put_max: int = 256
    """Finished trajectories put to the buffer in one call at most."""


class Env(Protocol):
    async def open(
        self, *, env: str, session_id: str, seed: int, options: dict[str, Any] | None = None
    ) -> env_protocol.Observation: ...

    async def step(self, session_id: str, action: str) -> env_protocol.StepResult: ...

    async def close(self, session_id: str) -> None: ...


class Agent(Protocol):
    async def generate(self, req: agent_protocol.GenerateRequest) -> agent_protocol.GenerateResult: ...

    async def abort(self, trajectory_id: str) -> bool: ...


class Reward(Protocol):
    async def score(self, req: reward_protocol.ScoreRequest) -> reward_protocol.ScoreResult: ...


class Placement(Protocol):
    async def assign(self, req: placement_protocol.AssignRequest) -> placement_protocol.Assignment: ...

    async def release(self, req: placement_protocol.ReleaseRequest) -> None: ...

    async def place_batch(self, req: placement_protocol.PlaceBatchRequest) -> int: ...


class Buffer(Protocol):
    async def put(self, trajectories: Sequence[common_pb2.Trajectory]) -> buffer_protocol.PutResult: ...


@dataclasses.dataclass(frozen=True, slots=True)
class PromptGroup:
    """A group of ``TaskConfig.members`` trajectories of one prompt, as submitted."""

    group_id: str
    task: str
    seed: int = 0
    options_json: str = ""
    """Environment options as a JSON object (empty: none)."""


@dataclasses.dataclass(frozen=True, slots=True)
class SubmitResult:
    accepted_groups: int
    """New groups queued (a group id already submitted is ignored)."""
    trajectories: int


@dataclasses.dataclass(frozen=True, slots=True)
class CommitResult:
    version: int
    aborted_trajectory_ids: tuple[str, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class TrajectoryResult:
    """A stored trajectory, as ``SchedulerService.results`` streams it."""

    trajectory_id: str
    group_id: str
    task: str
    status: str
    reason: str
    reward: float
    turns: int
    init_version: int
    min_version: int
    max_version: int
    output_tokens: int
    seconds: float


@dataclasses.dataclass(frozen=True, slots=True)
class TaskStats:
    task: str
    submitted: int
    completed: int
    failed: int
    aborted: int
    mean_reward: float


@dataclasses.dataclass(frozen=True, slots=True)
class Stats:
    """Totals since the start; ``submitted == pending + in_flight + unsaved + completed + failed +
    aborted``."""

    version: int
    suspended: bool
    submitted: int
    pending: int
    in_flight: int
    completed: int
    failed: int
    aborted: int
    unsaved: int
    turns: int
    env_retries: int
    failed_by_reason: dict[str, int]
    tasks: tuple[TaskStats, ...]
    stage_seconds: dict[str, float]
    preemptions: int
    turns_by_agent: dict[str, int]


@dataclasses.dataclass(frozen=True, slots=True)
class TrajectoryState:
    """One in-flight trajectory in the scheduling policy's order (``list_trajectories``)."""

    trajectory_id: str
    group_id: str
    task: str
    rank: int
    predicted_remaining: float
    tokens_so_far: int
    turns: int
    worker_id: str
    state: str
    """``generating``, ``waiting`` or ``other`` (environment, reward, admission)."""
    preemptions: int


@dataclasses.dataclass(frozen=True, slots=True)
class Listing:
    trajectories: tuple[TrajectoryState, ...]
    total: int


@dataclasses.dataclass(frozen=True)
class Work:
    """A validated prompt group."""

    group_id: str
    task: TaskConfig
    seed: int
    options: dict[str, Any] | None


def validate_groups(groups: Sequence[PromptGroup], tasks: Mapping[str, TaskConfig]) -> list[Work]:
    """Check every group (all or nothing); errors name ``groups[i].<field>``."""
    if not groups:
        raise SpecError("at least one group is required", field="groups")
    out = []
    ids: set[str] = set()
    for i, g in enumerate(groups):
        at = f"groups[{i}]"
        if not GROUP_ID.match(g.group_id):
            raise SpecError(f"must match {GROUP_ID.pattern}", field=f"{at}.group_id", value=g.group_id[:50])
        if g.group_id in ids:
            raise SpecError("repeated within one request", field=f"{at}.group_id", value=g.group_id)
        ids.add(g.group_id)
        if g.task not in tasks:
            raise SpecError(f"unknown task; known: {sorted(tasks)}", field=f"{at}.task", value=g.task[:50])
        if g.seed < 0:
            raise SpecError("must be >= 0", field=f"{at}.seed", value=g.seed)
        options: dict[str, Any] | None = None
        if g.options_json:
            if len(g.options_json) > MAX_OPTIONS_BYTES:
                raise SpecError(f"longer than {MAX_OPTIONS_BYTES} bytes", field=f"{at}.options_json")
            try:
                parsed = json.loads(g.options_json)
            except ValueError as exc:
                raise SpecError(f"not JSON: {exc}", field=f"{at}.options_json") from exc
            if not isinstance(parsed, dict):
                raise SpecError("must be a JSON object", field=f"{at}.options_json")
            options = parsed
        out.append(Work(group_id=g.group_id, task=tasks[g.task], seed=g.seed, options=options))
    return out
