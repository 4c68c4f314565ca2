"""Trajectory router state: Heddle's per-trajectory metadata and the step-boundary hook (§3, §5.3).

Called by the placement service (the paper's Rust router): ``from_placement`` when a batch is
placed, ``route`` for every step request, ``on_step`` when the scheduler publishes a trajectory's new
prediction at a step boundary, ``finish`` when it ends; and ``view`` by the scheduler, which
exposes each trajectory's rank, predicted remaining length and worker. The simulator drives the
same functions. The state is a frozen value: each call returns a new one, the shell keeps it.

The router strictly enforces the placement: a trajectory's steps all go to its group's worker
until ``on_step`` decides to migrate it (``migration.decide``: rank among the active trajectories
against the capacities scaled to how many are still active, only during a tool call). The state
then points at the target, so the next step request is routed there, and the move joins
``pending`` for the transmission scheduler (``migration.schedule_epoch``); with ``re-prefill`` (stock
vLLM) the warm-up prefill is best effort, with ``kv-transfer`` the shell holds the next request
until the transfer is done. Invariants (tested): every active trajectory has exactly one worker
from the placement; ranks are a permutation of ``0..n_active-1``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from types import MappingProxyType

from treadle.errors import NotFound, SpecError
from treadle.policy.heddle import migration, presorted_dp


@dataclasses.dataclass(frozen=True)
class Entry:
    worker_id: str
    predicted_remaining: float
    context_tokens: int = 0


@dataclasses.dataclass(frozen=True)
class TrajectoryView:
    """What the scheduler exposes for one trajectory."""

    trajectory_id: str
    rank: int
    """0 is the longest predicted remaining work (the presorted order, kept current)."""
    predicted_remaining: float
    worker_id: str


@dataclasses.dataclass(frozen=True)
class RouterState:
    workers: tuple[str, ...]
    """The placement's workers in group order (descending TP)."""
    capacities: tuple[int, ...]
    """The placement's group sizes ``c_j``."""
    entries: Mapping[str, Entry]
    pending: tuple[migration.Migration, ...] = ()
    """Migrations decided and not yet handed to the transmission scheduler."""


def from_placement(placed: presorted_dp.Placement, predictions: Mapping[str, float]) -> RouterState:
    """Router state for a freshly placed batch; ``predictions`` by trajectory id (the DP's input)."""
    entries: dict[str, Entry] = {}
    for group in placed.groups:
        for tid in group.trajectory_ids:
            if tid not in predictions:
                raise SpecError(f"no prediction for {tid!r}", field="predictions", value=tid)
            entries[tid] = Entry(worker_id=group.worker_id, predicted_remaining=predictions[tid])
    return RouterState(
        workers=tuple(g.worker_id for g in placed.groups),
        capacities=placed.capacities(),
        entries=MappingProxyType(entries),
    )


def route(state: RouterState, trajectory_id: str) -> str:
    """The worker that serves this trajectory's next step."""
    return _entry(state, trajectory_id).worker_id


def view(state: RouterState) -> list[TrajectoryView]:
    """Every active trajectory in rank order."""
    ordered = sorted(state.entries.items(), key=lambda kv: (-kv[1].predicted_remaining, kv[0]))
    return [
        TrajectoryView(tid, rank, e.predicted_remaining, e.worker_id) for rank, (tid, e) in enumerate(ordered)
    ]


def on_step(
    state: RouterState,
    trajectory_id: str,
    *,
    predicted_remaining: float,
    context_tokens: int,
    in_tool_call: bool,
    expected_tool_seconds: float = 0.0,
    cost: migration.MigrationCost = migration.MigrationCost(),  # noqa: B008 - frozen, shared safely
    predict_seconds: float = 0.0,
    max_exposed_s: float = math.inf,
    stale_tokens: float = 0.0,
) -> tuple[RouterState, migration.Migration | None]:
    """Record a new prediction; the migration it triggers, if any (already reflected in the state).

    ``stale_tokens``: see ``migration.decide``.
    """
    if not (predicted_remaining >= 0 and math.isfinite(predicted_remaining)):
        raise SpecError(
            "must be a finite number >= 0", field="predicted_remaining", value=predicted_remaining
        )
    entry = dataclasses.replace(
        _entry(state, trajectory_id), predicted_remaining=predicted_remaining, context_tokens=context_tokens
    )
    entries = dict(state.entries)
    entries[trajectory_id] = entry
    active = [
        migration.Active(
            trajectory_id=tid,
            worker_id=e.worker_id,
            predicted_remaining=e.predicted_remaining,
            context_tokens=e.context_tokens,
            in_tool_call=in_tool_call if tid == trajectory_id else False,
            expected_tool_seconds=expected_tool_seconds if tid == trajectory_id else 0.0,
        )
        for tid, e in entries.items()
    ]
    move = migration.decide(
        trajectory_id,
        active,
        workers=state.workers,
        capacities=state.capacities,
        cost=cost,
        predict_seconds=predict_seconds,
        max_exposed_s=max_exposed_s,
        stale_tokens=stale_tokens,
    )
    pending = state.pending
    if move is not None:
        entries[trajectory_id] = dataclasses.replace(entry, worker_id=move.target)
        pending = (*(m for m in pending if m.trajectory_id != trajectory_id), move)
    return dataclasses.replace(state, entries=MappingProxyType(entries), pending=pending), move


def take_pending(state: RouterState) -> tuple[RouterState, tuple[migration.Migration, ...]]:
    """Hand the decided migrations to the transmission scheduler, clearing them from the state."""
    return dataclasses.replace(state, pending=()), state.pending


def finish(state: RouterState, trajectory_id: str) -> RouterState:
    """Forget a finished (or aborted) trajectory; its pending migration is dropped too."""
    _entry(state, trajectory_id)
    entries = {tid: e for tid, e in state.entries.items() if tid != trajectory_id}
    pending = tuple(m for m in state.pending if m.trajectory_id != trajectory_id)
    return dataclasses.replace(state, entries=MappingProxyType(entries), pending=pending)


def _entry(state: RouterState, trajectory_id: str) -> Entry:
    try:
        return state.entries[trajectory_id]
    except KeyError:
        raise NotFound(f"trajectory {trajectory_id!r} is not routed") from None
