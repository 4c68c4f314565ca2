"""The presorted DP's contiguous plan or a longest-first interleaving, whichever is predicted to end sooner.

Called by ``policy.heddle_live.place`` for every admitted batch. The DP (``presorted_dp.plan``)
minimises Eq. (2), which prices a worker's group as if all of it ran for as long as its longest
member at the interference of its full size. That is the paper's model and Lemma 5.1 makes its
optimum contiguous. Measured live (``bench/reports/heddle-live.md``), the contiguous plan puts the
equally long trajectories, which run their turns in step, together on the first worker: once the
short ones are done that worker decodes them all at its largest batch while the others idle, and
full Heddle ended steps ~1 s later than Heddle's scheduling with sticky least-loaded placement.
A longest-first (LPT) interleaving, each trajectory to the worker with the least predicted work,
splits them evenly and measured at parity.

So both plans are priced by one model that sees the tail, and the better is kept (ours, not the
paper's): a fluid simulation of each worker's group (``presorted_dp.group_time``), its members
decoding in lockstep, longest first, at most ``slots`` at once (the gate's when 0: a global gate of
``G`` never runs more than ``G`` turns, on one worker or on all; all when no gate is given), each step costing
``t_base · interference[b - 1]`` at ``b`` running. This reads a worker's interference table as
the slowdown of one step at batch ``b``, which is what ``heddle_live.profiles``' ``1 + per_extra ·
(b - 1)`` is; a profiled I(s) of a whole group (``interference_by_simulation``) is not, so the
simulator, which passes those, does not call this. Ties keep the DP (the paper's plan). The
interleaving stands for a balanced plan: when it wins, the caller (``heddle_live``) does not route
by it but falls back to sticky least-loaded, which balances by load as turns come
(``heddle_live``'s module doc says why).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from treadle.errors import SpecError
from treadle.policy.heddle import presorted_dp


@dataclasses.dataclass(frozen=True)
class Choice:
    placement: presorted_dp.Placement
    interleaved: bool
    """True: the longest-first interleaving won (groups are not rank intervals)."""
    contiguous_s: float
    """The DP plan's predicted makespan by the fluid model."""
    interleaved_s: float
    """The interleaving's predicted makespan by the fluid model."""


def interleave(
    trajectories: Sequence[presorted_dp.Trajectory],
    workers: Sequence[presorted_dp.WorkerProfile],
    *,
    gate: int = 0,
) -> presorted_dp.Placement:
    """Longest first, each trajectory to the worker with the least predicted tokens so far (LPT)."""
    ordered_workers = presorted_dp.sort_workers(workers)
    ordered = sorted(trajectories, key=lambda t: (-t.predicted_length, t.trajectory_id))
    work = {w.worker_id: 0.0 for w in ordered_workers}
    members: dict[str, list[str]] = {w.worker_id: [] for w in ordered_workers}
    lengths = {t.trajectory_id: t.predicted_length for t in ordered}
    for t in ordered:
        # equal work: the worker with fewer members, then the worker order
        target = min(ordered_workers, key=lambda w: (work[w.worker_id], len(members[w.worker_id])))
        work[target.worker_id] += t.predicted_length
        members[target.worker_id].append(t.trajectory_id)
    groups = tuple(
        presorted_dp.Group(w.worker_id, tuple(ids), fluid_time(w, ids, lengths, gate=gate))
        for w in ordered_workers
        for ids in [members[w.worker_id]]
    )
    return presorted_dp.Placement(
        groups=groups, makespan=max(g.cost for g in groups), order=tuple(t.trajectory_id for t in ordered)
    )


def fluid_time(
    worker: presorted_dp.WorkerProfile,
    members: Sequence[str],
    lengths: Mapping[str, float],
    *,
    gate: int = 0,
) -> float:
    """Seconds until ``worker`` has decoded every member's predicted length (see the module doc).

    ``gate``: turns generating at once over all workers, the cap when the worker has no ``slots``
    (0: none given, every member runs at once).
    """
    if not members:
        return 0.0
    cap = min(len(members), worker.slots or gate or len(members))
    if cap > len(worker.interference):
        raise SpecError(
            f"{cap} running exceed the interference table ({len(worker.interference)})",
            field="interference", value=len(worker.interference),
        )  # fmt: skip
    steps = [worker.t_base * factor for factor in worker.interference[:cap]]
    return presorted_dp.group_time(steps, sorted((lengths[m] for m in members), reverse=True))


def choose(
    trajectories: Sequence[presorted_dp.Trajectory],
    workers: Sequence[presorted_dp.WorkerProfile],
    *,
    gate: int = 0,
) -> Choice:
    """The DP's plan unless the interleaving's fluid makespan is shorter (``gate``: see ``fluid_time``)."""
    if gate < 0:
        raise SpecError("must be >= 0", field="gate", value=gate)
    contiguous = presorted_dp.plan(trajectories, workers)
    interleaved = interleave(trajectories, workers, gate=gate)
    lengths = {t.trajectory_id: t.predicted_length for t in trajectories}
    by_id = {w.worker_id: w for w in workers}
    contiguous_s = max(
        (fluid_time(by_id[g.worker_id], g.trajectory_ids, lengths, gate=gate) for g in contiguous.groups),
        default=0.0,
    )
    better = interleaved.makespan < contiguous_s
    return Choice(interleaved if better else contiguous, better, contiguous_s, interleaved.makespan)
