"""Placement's own request and assignment types, their validation, and their proto conversions.

``PlacementService`` and its in-process callers (the scheduler, through ``service.InProcess``) speak
these types; protobuf is met only at the gRPC edge: ``grpc_server`` (server side) and ``client``
(the scheduler's side) convert with ``grpcutil.convert`` (and ``batch_*_pb`` below, for the nested
batch). Workers, loads and the pool state are
still the proto messages (registered and reported over gRPC by agents). Weight sync speaks
``SwapRequest`` / ``SwapResult`` (``weights.WeightSync``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection
from typing import Literal

from treadle.errors import SpecError
from treadle.services.grpcutil import convert
from treadle.v1 import placement_pb2


@dataclasses.dataclass(frozen=True, slots=True)
class AssignRequest:
    trajectory_id: str
    task: str
    turn: int = 0
    agent: str = ""
    """The agent whose turn this is (multi-agent tasks): only workers of a pool serving it qualify."""


@dataclasses.dataclass(frozen=True, slots=True)
class Assignment:
    worker_id: str
    address: str
    pool: str
    reason: str
    """The policy's reason: ``sticky``, ``least-loaded``, ``routed``, ``migrated``..."""
    work: str
    """``prefill-heavy`` or ``decode-heavy``, as resolved for the task."""
    agent: str = ""
    """The agent the worker's pool serves (empty when placement knows no pool agents)."""


@dataclasses.dataclass(frozen=True, slots=True)
class ReleaseRequest:
    trajectory_id: str
    task: str
    worker_id: str = ""
    """Worker of the finished turn; required with ``turn_finished``."""
    turn_finished: bool = False
    """One assigned turn is over: it no longer counts as outstanding on ``worker_id``."""
    final: bool = False
    """The trajectory ended: forget its sticky worker and add its turns to the task profile."""
    turns: int = 0
    """Turns the trajectory generated in all; with ``final``."""
    prompt_tokens: int = 0
    output_tokens: int = 0
    predicted_remaining: float | None = None
    """With ``turn_finished``: the predictor's remaining tokens after this turn (a batch-level policy
    may migrate the trajectory during its tool call)."""
    context_tokens: int = 0
    """With ``predicted_remaining``: the trajectory's context (prompt + output of this turn)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Candidate:
    trajectory_id: str
    task: str
    predicted_remaining: float = 0.0


@dataclasses.dataclass(frozen=True, slots=True)
class PlaceBatchRequest:
    trajectories: tuple[Candidate, ...]
    worker_slots: int = 0
    """Turns that may generate at once on one worker (the scheduler's ``Settings.worker_slots``)."""
    gate: int = 0
    """Turns that may generate at once over all workers (``Settings.max_concurrent_generations``);
    0: not given."""


MAX_SWAP_TIMEOUT_S = 3600.0
"""A swap's deadline at most: a Mooncake pull of a 70B checkpoint takes minutes, not hours."""
SwapOutcome = Literal["swapped", "failed", "timeout", "unreachable", "lost", "moved", "started"]


@dataclasses.dataclass(frozen=True, slots=True)
class SwapRequest:
    """``SwapWeights`` (and, with ``timeout_s`` unused, ``PrefetchWeights``): every worker of ``agent``."""

    version: int
    agent: str = ""
    """Whose workers (a multi-agent job); empty for a job of one agent."""
    timeout_s: float = 300.0


@dataclasses.dataclass(frozen=True, slots=True)
class WorkerSwap:
    worker_id: str
    pool: str
    outcome: SwapOutcome
    """``swapped``; ``failed`` (it keeps its previous version whole); ``timeout``; ``unreachable`` (its
    agent refused connections past ``weightsync.UNREACHABLE_AFTER_S``); ``lost`` (its agent stopped
    reporting: not waited for); ``moved`` (it serves another agent now); ``started`` (a prefetch)."""
    error: str = ""
    seconds: float = 0.0
    exposed_seconds: float = 0.0
    """Paused (no generation) this long: the exposed part of the swap."""
    pull: str = ""
    """``prefetched``, ``pulled``, ``held`` or ``label`` (``agent.client.Swapped.pull``); empty unless
    swapped."""


@dataclasses.dataclass(frozen=True, slots=True)
class SwapResult:
    version: int
    agent: str
    workers: tuple[WorkerSwap, ...]

    @property
    def swapped(self) -> tuple[str, ...]:
        return tuple(w.worker_id for w in self.workers if w.outcome == "swapped")


def check_swap(req: SwapRequest, agents: Collection[str]) -> str:
    """The agent whose workers swap; ``agents``: those the job's pools serve (none for a bare placement).
    A job of one agent may leave ``agent`` empty."""
    if req.version < 0:
        raise SpecError("must be >= 0", field="version", value=req.version)
    if not (0 < req.timeout_s <= MAX_SWAP_TIMEOUT_S):
        raise SpecError(
            f"must be within (0, {MAX_SWAP_TIMEOUT_S:.0f}]", field="timeout_s", value=req.timeout_s
        )
    if not req.agent and len(agents) <= 1:
        return next(iter(agents), "")
    if req.agent not in agents:
        raise SpecError(f"must name one of the job's agents {sorted(agents)}", field="agent", value=req.agent)
    return req.agent


def check_release(req: ReleaseRequest, tasks: Collection[str]) -> None:
    if not req.trajectory_id:
        raise SpecError("must not be empty", field="trajectory_id")
    if not (req.turn_finished or req.final):
        raise SpecError("a release needs turn_finished, final or both", field="turn_finished")
    if req.prompt_tokens < 0 or req.output_tokens < 0:
        raise SpecError("must be >= 0", field="prompt_tokens" if req.prompt_tokens < 0 else "output_tokens")
    _check_task(req.task, tasks, "task")


def check_step(req: ReleaseRequest) -> float:
    """The prediction of a release at a step boundary (``predicted_remaining`` set), checked."""
    predicted = req.predicted_remaining
    if predicted is None or not (predicted >= 0 and math.isfinite(predicted)):
        raise SpecError("must be a finite number >= 0", field="predicted_remaining", value=predicted)
    if req.context_tokens < 0:
        raise SpecError("must be >= 0", field="context_tokens", value=req.context_tokens)
    return predicted


def batch_by_task(req: PlaceBatchRequest, tasks: Collection[str]) -> dict[str, dict[str, float]]:
    """Check every candidate (all or nothing); their predictions by task and trajectory."""
    by_task: dict[str, dict[str, float]] = {}
    for i, c in enumerate(req.trajectories):
        at = f"trajectories[{i}]"
        if not c.trajectory_id:
            raise SpecError("must not be empty", field=f"{at}.trajectory_id")
        _check_task(c.task, tasks, f"{at}.task")
        if not (c.predicted_remaining >= 0 and math.isfinite(c.predicted_remaining)):
            raise SpecError(
                "must be a finite number >= 0", field=f"{at}.predicted_remaining", value=c.predicted_remaining
            )
        by_task.setdefault(c.task, {})[c.trajectory_id] = c.predicted_remaining
    if req.worker_slots < 0:
        raise SpecError("must be >= 0", field="worker_slots", value=req.worker_slots)
    if req.gate < 0:
        raise SpecError("must be >= 0", field="gate", value=req.gate)
    return by_task


def _check_task(task: str, tasks: Collection[str], field: str) -> None:
    if task not in tasks:
        raise SpecError(f"unknown task; known: {sorted(tasks)}", field=field, value=task)


# --- protobuf, at the gRPC edge only (grpc_server, client) ------------------------------------------


def batch_from_pb(msg: placement_pb2.PlaceBatchRequest) -> PlaceBatchRequest:
    candidates = tuple(convert.from_pb(Candidate, c) for c in msg.trajectories)
    return convert.from_pb(PlaceBatchRequest, msg, trajectories=candidates)


def batch_to_pb(req: PlaceBatchRequest) -> placement_pb2.PlaceBatchRequest:
    candidates = [convert.to_pb(c, placement_pb2.PlaceCandidate) for c in req.trajectories]
    return convert.to_pb(req, placement_pb2.PlaceBatchRequest, trajectories=candidates)


def swap_result_from_pb(msg: placement_pb2.SwapWeightsResponse) -> SwapResult:
    workers = tuple(convert.from_pb(WorkerSwap, w) for w in msg.workers)
    return convert.from_pb(SwapResult, msg, workers=workers)


def swap_result_to_pb(result: SwapResult) -> placement_pb2.SwapWeightsResponse:
    workers = [convert.to_pb(w, placement_pb2.WorkerSwap) for w in result.workers]
    return convert.to_pb(result, placement_pb2.SwapWeightsResponse, workers=workers)
