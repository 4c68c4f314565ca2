"""Heddle's batch placement, trajectory routing and migration as the live placement service runs them.

Called by the placement service under a policy in ``registry.BATCH_PLACEMENT`` (``heddle``): at
every admitted batch (``place``), every turn (``route``), every step boundary (``on_step``, when
the scheduler publishes the trajectory's new prediction as it enters its tool call) and when a
trajectory ends (``finish``); the simulator can drive the same functions. It composes the pure
Heddle modules, unchanged: ``heddle.presorted_dp.plan``, ``heddle.router`` and
``heddle.migration.schedule_epoch``. State is one frozen ``Live`` value per task; each call
returns the next one.

* **Placement** (§5.1-5.2): the trajectories admitted together are placed with the presorted DP
  over *every* trajectory of the task still active, with their latest predictions, so group sizes
  ``c_j`` reflect the whole load. Trajectories already routed keep their worker (their prefix
  cache is there); where the new plan disagrees, migration corrects them at their next tool call.
  Live engines give no profiled interference table, so ``I(s) = 1 + per_extra · (s - 1)`` (ours:
  monotone, as the paper's premise 3 requires) on identical workers.
* **Slots** (ours): the paper's ``I(s)`` assumes a worker's whole group runs as one batch, but a
  per-worker gate (``Settings.worker_slots`` = ``c``) runs at most ``c`` of it at once. A group of
  ``s > c`` is priced ``I(c) · max(L_head, ΣL / c)`` (``presorted_dp.WorkerProfile.slots``): it
  lasts at least its longest member and at least its total work spread over ``c`` slots. The
  earlier price, ``s / c`` waves each as long as the head, charged a group of one long and many
  short trajectories as if all were long. Under a global gate the scheduler passes no slots and
  the group is priced as one batch (the paper's Eq. 2). With the predictor's spread right (its
  credibility weight, ``heddle.predictor``: warm admission predictions on ``bench/heddle_live.py``
  are exact), pricing by the whole gate ``G`` gives the first worker the 9 longest trajectories,
  by a worker's share ``G / m`` 13, by Eq. 2 18; measured live, none beats sticky least-loaded
  under a saturated global gate: every contiguous plan stacks the equally long trajectories, which
  run their turns in step, on one engine (``bench/reports/heddle-live.md``). So a global gate
  keeps Eq. 2, the paper's rule.
* **Fallback** (ours): ``heddle.fallback.choose`` prices the DP's plan against a longest-first
  interleaving, which stands for a balanced plan, by a fluid simulation of each worker's batch
  (which sees the tail where the long ones run alone on one worker). When the interleaving is
  predicted to end sooner, the task falls back (``Live.fallen_back``): its turns go to the per-turn
  policy, sticky least-loaded, as under ``sticky-least-loaded`` itself, with no re-plan and no
  migration, until none of its trajectories is in flight; the next batch is planned afresh. The
  choice is made at every admitted batch and at every re-plan. The fluid model caps a worker's
  batch at the scheduler's global gate (``gate``): without the cap, a plan that gives one worker
  196 short trajectories was priced as if they all ran at once, while a gate of 8 runs them 8 at a
  time. In the agentic regime (``bench/reports/heddle-intervals.md``) the uncapped model kept the
  crowded plan (full Heddle 0.86x [0.83-0.88] of Heddle's scheduling, SIMULATED, run 12), and
  keeping the routes a fallen-back step already had, instead of sticky least-loaded's balancing
  by load, measured 0.95x [0.90-1.00] on real vLLM (run 14).
* **Routing**: every turn of a trajectory goes to its router entry's worker (strict, as the
  paper's Rust router).
* **Migration** (§5.3): ``router.on_step`` re-ranks the trajectory among the active ones and, if
  the rank now falls in another worker's capacity interval, decides a move. The others'
  predictions may be a turn older than this one, so peers up to this turn's context growth longer
  count as possible ties (``migration.decide``'s ``stale_tokens``); without it equally long
  trajectories slid one by one off their worker, each ranking last right after its own step (live:
  the six longest all ended on one engine). The capacities come
  from the DP re-run over the active trajectories' latest predictions once every
  ``n_active / REPLAN_DIVISOR`` step boundaries (ours; the paper scales the admission-time sizes to
  avoid the DP's cost, and re-running it at every boundary costs ~15 ms at 1,024 trajectories, so
  it is amortised to well under a millisecond per boundary; between re-plans the sizes are scaled as
  in the paper, by ``router.on_step``). Our default predictor
  reads no prompt text, so at admission every trajectory of a task gets the same prediction and the
  admission DP is an even split that carries no information. Re-planning is what lets a
  trajectory that turned out long get a small group (Eq. 2: a big group slows its longest member).
  On stock vLLM a move is a **re-route plus a prefix re-prefill** on the target: there is no KV
  transfer between engines, the next turn's request simply goes to the target, which prefills the
  whole context (the source's copy ages out of its prefix cache). The transmission scheduler
  (``migration.schedule_epoch``) still applies: a worker takes part in at most one move in transit
  (decided, its next turn not yet routed), so a burst of re-rankings cannot pile re-prefills onto
  one engine; a move that cannot launch is dropped and the trajectory stays (it may move at a later
  tool call).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from types import MappingProxyType

from treadle.errors import SpecError
from treadle.policy.heddle import fallback, migration, presorted_dp, router

REPLAN_DIVISOR = 16
"""The DP is re-run after every ``max(1, n_active // REPLAN_DIVISOR)`` step boundaries."""
DEFAULT_PER_EXTRA = 0.05
"""Interference added per extra trajectory in a worker's group (``I(s) = 1 + per_extra · (s - 1)``)."""
UNLIMITED = 0
"""``slots`` value for a worker with no gate: its whole group runs as one batch."""


@dataclasses.dataclass(frozen=True)
class Live:
    """One task's router state and the migrations in transit."""

    router: router.RouterState | None = None
    in_transit: tuple[migration.Migration, ...] = ()
    since_plan: int = 0
    """Step boundaries since the group sizes were last re-planned."""
    fallen_back: bool = False
    """``fallback`` predicted a balanced plan to end sooner than the DP's: turns go to the per-turn
    policy (sticky least-loaded), no re-plan, no migration, until no trajectory is in flight."""


def profiles(
    workers: Sequence[str], *, max_group: int, per_extra: float = DEFAULT_PER_EXTRA, slots: int = UNLIMITED
) -> list[presorted_dp.WorkerProfile]:
    """Identical worker profiles for the DP (unit ``t_base``: only the relative makespan matters).

    ``slots``: turns a worker generates at once (``UNLIMITED``: all of its group); see the module doc.
    """
    if per_extra < 0:
        raise SpecError("must be >= 0", field="per_extra", value=per_extra)
    if slots < 0:
        raise SpecError("must be >= 0", field="slots", value=slots)
    table = tuple(1.0 + per_extra * (s - 1) for s in range(1, max(1, max_group) + 1))
    return [
        presorted_dp.WorkerProfile(worker_id=w, t_base=1.0, interference=table, slots=slots) for w in workers
    ]


def place(
    live: Live,
    new: Mapping[str, float],
    workers: Sequence[str],
    *,
    per_extra: float = DEFAULT_PER_EXTRA,
    slots: int = UNLIMITED,
    gate: int = 0,
) -> Live:
    """Place ``new`` (trajectory id -> predicted remaining tokens) on ``workers``; see the module doc.

    ``gate``: the scheduler's global gate (0: not given), which caps the fallback's fluid model.
    """
    if not workers:
        raise SpecError("no worker to place on", field="workers", value=[])
    if live.fallen_back and live.router is not None and live.router.entries:
        return live  # fallen back until the trajectories in flight are done: new ones go unrouted
    old = live.router.entries if live.router is not None else {}
    predictions = {tid: e.predicted_remaining for tid, e in old.items()}
    predictions.update(new)
    trajectories = [presorted_dp.Trajectory(tid, p) for tid, p in predictions.items()]
    chosen = fallback.choose(
        trajectories,
        profiles(workers, max_group=len(trajectories), per_extra=per_extra, slots=slots),
        gate=gate,
    )
    state = router.from_placement(chosen.placement, predictions)
    entries = dict(state.entries)
    for tid, entry in old.items():
        if tid not in new and entry.worker_id in workers:
            entries[tid] = entry
    state = dataclasses.replace(state, entries=MappingProxyType(entries))
    return dataclasses.replace(live, router=state, fallen_back=chosen.interleaved)


def route(live: Live, trajectory_id: str) -> tuple[Live, str | None, bool]:
    """(next state, the worker of this turn or ``None`` if not routed, whether it completes a migration).

    ``None`` also while the task has fallen back: the caller's per-turn policy places the turn.
    """
    if live.fallen_back or live.router is None or trajectory_id not in live.router.entries:
        return live, None, False
    worker = router.route(live.router, trajectory_id)
    in_transit = tuple(m for m in live.in_transit if m.trajectory_id != trajectory_id)
    return dataclasses.replace(live, in_transit=in_transit), worker, len(in_transit) < len(live.in_transit)


def on_step(
    live: Live,
    trajectory_id: str,
    *,
    predicted_remaining: float,
    context_tokens: int,
    cost: migration.MigrationCost = migration.MigrationCost(),  # noqa: B008 - frozen, shared safely
    per_extra: float = DEFAULT_PER_EXTRA,
    slots: int = UNLIMITED,
    gate: int = 0,
) -> tuple[Live, migration.Migration | None]:
    """Record a step boundary (the trajectory is entering its tool call); the migration launched, if any."""
    if live.router is None or trajectory_id not in live.router.entries:
        return live, None
    if live.fallen_back:
        return _recorded(live, trajectory_id, predicted_remaining, context_tokens), None
    state, since = live.router, live.since_plan + 1
    if since >= max(1, len(state.entries) // REPLAN_DIVISOR):
        replanned = _replanned(state, trajectory_id, predicted_remaining, per_extra, slots, gate)
        if replanned is None:  # the DP's plan is now predicted worse: fall back
            live = dataclasses.replace(live, fallen_back=True, since_plan=0)
            return _recorded(live, trajectory_id, predicted_remaining, context_tokens), None
        state, since = replanned, 0
    live = dataclasses.replace(live, since_plan=since)
    # The others' predictions may be a turn older than this one: about what this turn added.
    previous = state.entries[trajectory_id].context_tokens
    state, move = router.on_step(
        state, trajectory_id, predicted_remaining=predicted_remaining, context_tokens=context_tokens,
        in_tool_call=True, cost=cost, stale_tokens=max(0, context_tokens - previous) if previous else 0,
    )  # fmt: skip
    state, _ = router.take_pending(state)
    if move is None:
        return dataclasses.replace(live, router=state), None
    busy = {end for m in live.in_transit for end in (m.source, m.target)}
    if migration.schedule_epoch([move], busy) is None:
        entries = dict(state.entries)
        entries[trajectory_id] = dataclasses.replace(entries[trajectory_id], worker_id=move.source)
        state = dataclasses.replace(state, entries=MappingProxyType(entries))
        return dataclasses.replace(live, router=state), None
    return dataclasses.replace(live, router=state, in_transit=(*live.in_transit, move)), move


def _recorded(live: Live, trajectory_id: str, predicted_remaining: float, context_tokens: int) -> Live:
    """``live`` with the trajectory's new prediction and context, and nothing else changed."""
    assert live.router is not None
    entries = dict(live.router.entries)
    entries[trajectory_id] = dataclasses.replace(
        entries[trajectory_id], predicted_remaining=predicted_remaining, context_tokens=context_tokens
    )
    return dataclasses.replace(
        live, router=dataclasses.replace(live.router, entries=MappingProxyType(entries))
    )


def _replanned(
    state: router.RouterState,
    trajectory_id: str,
    predicted_remaining: float,
    per_extra: float,
    slots: int,
    gate: int,
) -> router.RouterState | None:
    """``state`` with its group sizes from the DP over the active trajectories' latest predictions;
    ``None`` when ``fallback`` predicts the interleaving to end sooner than the DP's plan."""
    predictions = {tid: e.predicted_remaining for tid, e in state.entries.items()}
    predictions[trajectory_id] = predicted_remaining
    trajectories = [presorted_dp.Trajectory(tid, p) for tid, p in predictions.items()]
    chosen = fallback.choose(
        trajectories,
        profiles(state.workers, max_group=len(trajectories), per_extra=per_extra, slots=slots),
        gate=gate,
    )
    if chosen.interleaved:
        return None
    placed = chosen.placement
    return dataclasses.replace(
        state, workers=tuple(g.worker_id for g in placed.groups), capacities=placed.capacities()
    )


def finish(live: Live, trajectory_id: str) -> Live:
    """Forget an ended trajectory (no-op if it was never routed)."""
    if live.router is None or trajectory_id not in live.router.entries:
        return live
    in_transit = tuple(m for m in live.in_transit if m.trajectory_id != trajectory_id)
    return dataclasses.replace(live, router=router.finish(live.router, trajectory_id), in_transit=in_transit)


def view(live: Live) -> list[router.TrajectoryView]:
    """Every routed trajectory in presorted rank order (0 is the longest predicted remaining)."""
    return [] if live.router is None else router.view(live.router)
