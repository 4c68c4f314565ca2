"""Staleness-bounded admission of new trajectories and the per-iteration staleness check.

Called by the scheduler service (``treadle.services.scheduler``) before it starts a prompt group and
after every policy-version commit, and by the simulator at the same points.

Admission follows AReaL's StalenessManager (``areal/infra/staleness_manager.py``), counted in
trajectories::

    capacity = min(max_in_flight - running,
                   (alpha + version + 1) * batch_size - (accepted + running))

``version`` is the policy version the workers serve now (starting at 0), ``accepted`` the number of
trajectories that have finished (put to the buffer, whatever their status) since the start, and
``running`` those started and not finished. With this rule the trajectories ever started never
exceed what the trainer can consume within ``alpha`` versions, so nothing started under version v is
older than ``alpha`` when the trainer reaches it -- if the trainer consumes ``batch_size`` per version.

AReaL bounds staleness only at the start. RollArt (footnote 1, §6.2) also checks in every
iteration: after a commit to version n, every in-flight trajectory initiated before ``n - alpha`` is
aborted (``stale_in_flight``). A group is admitted whole or not at all (``admit_groups``) because
GRPO needs every member of a group.

Units (issue #4): the buffer hands the trainer whole groups until at least ``batch_size``
trajectories are in (``batching.plan_batch``), so one training step consumes
``ceil(batch_size / members) * members`` trajectories, ``members`` counting redundancy. Admission
counts the window in that same unit (``batch_trajectories``); counting it in raw ``batch_size``
deadlocked whenever ``batch_size`` was not a multiple of ``members``: with ``alpha = 0``, batch 6
and groups of 4, one group fit the window, the second never did, and the buffer could never form a
batch of 6 from 4 trajectories, so the version never moved.

Failed members (issue 18, found on the dev cluster with pods deleted under a run): the live scheduler
counts ``accepted`` in *completed* trajectories (what the trainer can use; a failed one frees its
place), and the buffer delivers a group's completed members only, taking groups until a batch holds
``batch_size`` of them. With holes in groups two things stalled a run for good: (1) the holes (4 of
a batch of 32, say) can only be filled by a whole new group, which a window with 4 places left never
admitted; (2) a batch of partial groups takes more than ``batch_size`` trajectories, and that excess
accumulated against the window version after version. So a group starts while the window has *any*
room (it may overshoot by fewer than ``group_size`` trajectories, which only happens when members
failed), and, given ``consumed`` (the trajectories the buffer has delivered to the trainer), what the
trainer took beyond ``batch_size`` per version no longer counts. The hard bound stays the buffer's
(it evicts groups staler than ``alpha``) and ``stale_in_flight``'s.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping


@dataclasses.dataclass(frozen=True)
class AdmissionState:
    """What the scheduler has counted so far."""

    version: int
    accepted: int
    running: int
    consumed: int | None = None
    """Of ``accepted``, those the trainer has taken (the buffer's delivered count); None: not known,
    every accepted one counts."""


@dataclasses.dataclass(frozen=True)
class Limits:
    """The knobs of the rule; all counted in trajectories."""

    alpha: int
    batch_size: int
    max_in_flight: int


def capacity(state: AdmissionState, limits: Limits) -> int:
    """How many more trajectories may start now (never negative)."""
    by_concurrency = limits.max_in_flight - state.running
    by_staleness = (limits.alpha + state.version + 1) * limits.batch_size - (
        _counted(state, limits) + state.running
    )
    return max(0, min(by_concurrency, by_staleness))


def _counted(state: AdmissionState, limits: Limits) -> int:
    """``accepted``, less what the trainer took beyond ``batch_size`` per version it has reached."""
    if state.consumed is None:
        return state.accepted
    budgeted = (state.version + 1) * limits.batch_size
    return state.accepted - state.consumed + min(state.consumed, budgeted)


def batch_trajectories(batch_size: int, group_size: int) -> int:
    """Trajectories one training batch takes when it is made of whole groups of ``group_size``."""
    return -(-batch_size // group_size) * group_size


def admit_groups(state: AdmissionState, limits: Limits, *, group_size: int, pending_groups: int) -> int:
    """How many of ``pending_groups`` whole groups of ``group_size`` may start now.

    The window is counted in whole groups, as the buffer delivers them (``batch_trajectories``); a
    group starts while any room is left (failed members leave room smaller than a group: see above).
    The concurrency cap is never exceeded.
    """
    if group_size <= 0:
        return 0
    whole = dataclasses.replace(limits, batch_size=batch_trajectories(limits.batch_size, group_size))
    room = capacity(state, whole)
    by_concurrency = (limits.max_in_flight - state.running) // group_size
    return max(0, min(pending_groups, -(-room // group_size), by_concurrency))


def is_stale(init_version: int, *, version: int, alpha: int) -> bool:
    """RollArt's bound: a trajectory initiated under ``init_version`` is stale at ``version``."""
    return init_version < version - alpha


def stale_in_flight(in_flight: Mapping[str, int], *, version: int, alpha: int) -> list[str]:
    """Ids (sorted) of in-flight trajectories to abort after committing ``version``.

    ``in_flight`` maps trajectory id to the policy version it was initiated under.
    """
    return sorted(tid for tid, init in in_flight.items() if is_stale(init, version=version, alpha=alpha))


@dataclasses.dataclass(frozen=True)
class Step:
    """One row of a whole-sequence run: what was admitted and what the counters became."""

    version: int
    admitted: int
    running: int
    accepted: int


def run_to_completion(
    limits: Limits,
    *,
    group_size: int,
    total_groups: int,
    finish_per_round: int,
    rounds_per_version: int,
    max_rounds: int = 10_000,
) -> list[Step]:
    """Drive the rule on a synthetic steady workload until every group has finished.

    Each round admits what the rule allows, then finishes up to ``finish_per_round`` running
    trajectories; every ``rounds_per_version`` rounds the version goes up by one. The simulator
    and the unit tests use it to check that the staleness bound holds over a whole run.
    """
    state = AdmissionState(version=0, accepted=0, running=0)
    pending = total_groups
    steps: list[Step] = []
    for rnd in range(max_rounds):
        if pending == 0 and state.running == 0:
            break
        groups = admit_groups(state, limits, group_size=group_size, pending_groups=pending)
        pending -= groups
        running = state.running + groups * group_size
        finished = min(running, finish_per_round)
        version = state.version + (1 if (rnd + 1) % rounds_per_version == 0 else 0)
        state = AdmissionState(
            version=version, accepted=state.accepted + finished, running=running - finished
        )
        steps.append(
            Step(
                version=state.version,
                admitted=groups * group_size,
                running=state.running,
                accepted=state.accepted,
            )
        )
    return steps
