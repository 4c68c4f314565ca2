"""The interfaces of its dependencies, its request and result types, and
validation of submitted work.

The service takes and returns these types; ``grpc_server`` converts them to and from protobuf (the
trajectories put to the buffer stay ``common_pb2.Trajectory``: the buffer's own input type).

Used by ``service.SchedulerService`` (dependencies are injected by keyword, as these ``Protocol``s,
so the gRPC clients and the in-process services are interchangeable). Its configuration
(``TaskConfig`` / ``Settings``) is ``treadle.api.jobconfig``'s, translated from the RolloutJob.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from treadle.api import jobconfig
from treadle.errors import SpecError
from treadle.services.agent import protocol as agent_protocol
from treadle.services.buffer import protocol as buffer_protocol
from treadle.services.env import protocol as env_protocol
from treadle.services.placement import protocol as placement_protocol
from treadle.services.reward import protocol as reward_protocol
from treadle.v1 import common_pb2

GROUP_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,150}$")
MAX_OPTIONS_BYTES = 64 * 1024


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
    """A group of ``jobconfig.TaskConfig.members`` trajectories of one prompt, as submitted."""

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
class Recovery:
    """What a restarted scheduler took up from its journal (``SchedulerService.recover``)."""

    version: int
    groups: int
    trajectories: int


@dataclasses.dataclass(frozen=True, slots=True)
class Progress:
    """What the trainer said with its latest commit: the job's ``status.policyVersion``, ``step`` and
    ``meanReward`` (``jobreport.JobReporter.report_progress`` writes them on the RolloutJob)."""

    version: int
    step: int
    """Training step that produced ``version`` (0: the trainer did not say)."""
    mean_reward: float | None
    """Mean reward of the batch ``version`` was trained on (None: not said)."""

    @classmethod
    def checked(cls, *, version: int, step: int, mean_reward: float | None) -> Progress:
        """A commit's progress, refused naming the field when ``step`` or ``mean_reward`` is not usable."""
        if step < 0:
            raise SpecError("must be >= 0", field="step", value=step)
        if mean_reward is not None and not math.isfinite(mean_reward):
            raise SpecError("must be a finite number", field="mean_reward", value=mean_reward)
        return cls(version=version, step=step, mean_reward=mean_reward)


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
    step: int = 0
    """The training step of the committed version, as its commit said (0: none said)."""


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
    task: jobconfig.TaskConfig
    seed: int
    options: dict[str, Any] | None
    pool: int = 0
    """Trajectories started for the group: the task's ``members``, or the pool DARTS allocated it
    (``darts.Darts.plan``); 0 until set."""
    only: tuple[int, ...] = ()
    """A group recovered after a restart with some members stored: the members still to run (empty:
    every member)."""
    stored_size: int = 0
    """The group size its members are stored with, when not ``size`` (a recovered DARTS group)."""

    @property
    def size(self) -> int:
        """Members of the whole group (the pool)."""
        return self.pool or self.task.members

    @property
    def members(self) -> int:
        """Trajectories this work starts."""
        return len(self.only) if self.only else self.size

    @property
    def indices(self) -> Sequence[int]:
        """The member indices this work starts (``<group id>-<index>`` are their trajectory ids)."""
        return self.only or range(self.size)

    @property
    def group_size(self) -> int:
        """The group size its trajectories are stored with."""
        return self.stored_size or self.size


def validate_groups(groups: Sequence[PromptGroup], tasks: Mapping[str, jobconfig.TaskConfig]) -> list[Work]:
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
