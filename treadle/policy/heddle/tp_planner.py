"""Trajectory-adaptive tensor parallelism: simulated annealing over TP degrees (Heddle §6, Alg. 2).

Called periodically (between rollout steps, amortised over several; the paper gives no period) by
the operator's planning loop with the predicted lengths of the next batch, and by the simulator.
Its output is a ``PoolReshape``: how many replicas of each TP degree the GPU budget should hold;
``pools_after`` maps it onto an agent's pools (``tensorParallelSize`` × ``replicas``), which the
operator writes back to the RolloutJob.

Problem: split ``gpus`` into workers of degrees ``g_1 >= g_2 >= ...`` from ``degrees`` (sum =
``gpus``) minimising the batch makespan. Decoupled as in the paper: the cost of an allocation is
``presorted_dp.solve`` over the workers taken in descending degree (sort-initialised mapping: the
longest trajectories land on the highest TP), with each degree's ``t_base(g)`` and ``I_g(s)``.

Scoring the DP's placement (ours, where profiles carry ``step_times``): the DP places with Eq. (2),
as the placement service will, but the allocation is scored by a fluid simulation of each worker's
own group (``presorted_dp.interference_by_simulation`` on that group's shape). ``I_g(s)`` profiled
on the batch's shape models a group as one long head plus tiny members, which holds for the head's
group only; for the later groups (many trajectories of similar length that run in KV-bound waves)
it under-priced the time several-fold, so the search favoured narrow workers holding hundreds of
trajectories. Measured on the Heddle simulator (coding, Qwen3-14B, 8 H800, exact predictions): the
Eq. (2) score ranked 1xTP4 + 1xTP2 + 2xTP1 (210 s) above Fix-8 (251 s), which the simulator ran in
788 s and 422 s; scored by group simulation the ranking of Fix-8 < 2xTP4 < 4xTP2 < 8xTP1 matches the
simulator's. Still absent from the score (the paper's Eq. (1) has them): tool time, prefill and the
number of steps (additive per trajectory and nearly allocation-independent here), and context growth
(step times are profiled at a mean context). The score also trusts the predicted lengths: a predictor
that compresses the tail still misleads it (``bench/reports/heddle-analysis.md``).

Annealing (Algorithm 2; the paper names the moves and T0, we choose the rest):

* start: degrees sampled uniformly (``rng``) among those that still fit, until the budget is used;
* ``T0`` = the start's makespan; ``T <- cooling · T`` after ``moves_per_temperature`` proposals;
  stop when ``T < min_temperature_ratio · T0`` or after ``max_evaluations`` distinct allocations;
* moves, one drawn uniformly among those possible: *split* a worker of degree ``g`` into two of
  ``g/2``; *merge* two workers of degree ``g`` into one of ``2g``; *redistribute*: split one worker
  and merge two others, which moves GPUs along the degree ladder while keeping the worker count;
* Metropolis acceptance ``exp(-Δ / T)``; costs are memoised per allocation.

The energy is ``makespan + busy_weight · busy``, where ``busy`` is the GPU-seconds the placement
keeps workers busy divided by ``gpus`` (ours, ``busy_weight = 0.1``). With a long tail the makespan
alone is flat over most allocations (it is the longest trajectory alone on the largest worker), and
the small second term breaks those ties towards throughput: low TP for the short trajectories,
which is Fig. 16's "high early throughput and a fast tail".

Also ours: every homogeneous allocation (Fix-1 ... Fix-8 in the paper's ablation) is scored first
and seeds the best, so the plan is never worse than the best fixed TP. Deterministic for a seed.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import random
from collections.abc import Mapping, Sequence

from treadle.errors import SpecError
from treadle.policy.heddle import presorted_dp


@dataclasses.dataclass(frozen=True)
class DegreeProfile:
    """How a worker of ``tp`` GPUs decodes (profiled or from ``treadle.policy.costmodel``)."""

    tp: int
    t_base: float
    """Seconds per token at batch size one."""
    interference: tuple[float, ...]
    """``I_tp(s)`` for ``s = 1..len`` trajectories (see ``presorted_dp.WorkerProfile``)."""
    step_times: tuple[float, ...] = ()
    """Decode step seconds with ``1..B`` sequences running, ``B`` the most a worker runs at once (its
    ``max_seqs`` or KV room). Given, an allocation is scored by simulating every placed group's own
    members (see the module doc); empty, by Eq. (2)'s ``I_tp(|G|) · t_base · L_max`` alone."""


@dataclasses.dataclass(frozen=True)
class Annealing:
    seed: int = 0
    cooling: float = 0.95
    min_temperature_ratio: float = 1e-3
    moves_per_temperature: int = 8
    max_evaluations: int = 2000
    """Distinct allocations scored at most (each is one DP), the run-time bound."""
    busy_weight: float = 0.1
    """Weight of the mean GPU-busy seconds against the makespan in the energy."""


@dataclasses.dataclass(frozen=True)
class Plan:
    degrees: tuple[int, ...]
    """TP degree of every worker, descending."""
    makespan: float
    start_makespan: float
    energy: float
    """``makespan + busy_weight · busy`` of ``degrees``, what the search minimised."""
    evaluations: int
    """Distinct allocations scored (DP runs)."""


@dataclasses.dataclass(frozen=True)
class PoolReshape:
    """Replicas per TP degree, descending degree; what the operator applies to the pools."""

    replicas: tuple[tuple[int, int], ...]


@dataclasses.dataclass(frozen=True)
class Score:
    makespan: float
    busy: float
    """GPU-seconds the balanced placement keeps workers busy, divided by the GPU count."""
    energy: float


def cost(
    lengths: Sequence[float],
    degrees: Sequence[int],
    profiles: Sequence[DegreeProfile],
    *,
    busy_weight: float = Annealing.busy_weight,
) -> Score:
    """The annealing's cost of one allocation for ``lengths`` (any order)."""
    by_tp = {p.tp: p for p in profiles}
    unknown = sorted(set(degrees) - set(by_tp))
    if unknown:
        raise SpecError(f"no profile for TP {unknown}", field="degrees", value=unknown)
    return _Scorer(sorted(lengths, reverse=True), by_tp, busy_weight).score(
        tuple(sorted(degrees, reverse=True))
    )


def plan(
    lengths: Sequence[float],
    *,
    gpus: int,
    profiles: Sequence[DegreeProfile],
    annealing: Annealing = Annealing(),
) -> Plan:
    """Search TP degrees for a batch whose predicted lengths are ``lengths`` (any order)."""
    by_tp = _check(gpus, profiles, annealing)
    rng = random.Random(annealing.seed)
    scorer = _Scorer(sorted(lengths, reverse=True), by_tp, annealing.busy_weight)
    degrees = sorted(by_tp)
    current = _sample(gpus, degrees, rng)
    start = scorer.score(current)
    current_energy = start.energy
    best, best_energy = current, current_energy
    for g in degrees:  # the homogeneous allocations: never plan worse than a fixed TP
        if gpus % g == 0:
            homogeneous = (g,) * (gpus // g)
            energy = scorer.score(homogeneous).energy
            if energy < best_energy:
                best, best_energy = homogeneous, energy
    if math.isinf(best_energy):
        raise SpecError("the batch fits no allocation of these degrees", field="profiles", value=degrees)
    if math.isinf(current_energy):  # an unlucky start: anneal from the best homogeneous allocation
        current, current_energy = best, best_energy
    temperature = current_energy
    floor = annealing.min_temperature_ratio * current_energy
    proposals = 0
    while temperature > floor and len(scorer.memo) < annealing.max_evaluations:
        candidate = _perturb(current, set(degrees), rng)
        if candidate is None:
            break  # no move exists (a single worker of the only degree)
        delta = scorer.score(candidate).energy - current_energy
        if delta < 0 or rng.random() < math.exp(-delta / temperature):
            current, current_energy = candidate, current_energy + delta
            if current_energy < best_energy:
                best, best_energy = current, current_energy
        proposals += 1
        if proposals % annealing.moves_per_temperature == 0:
            temperature *= annealing.cooling
    chosen = scorer.score(best)
    return Plan(
        degrees=best,
        makespan=chosen.makespan,
        start_makespan=start.makespan,
        energy=chosen.energy,
        evaluations=len(scorer.memo),
    )


def reshape(current: Sequence[int], planned: Plan) -> PoolReshape | None:
    """The replicas per degree to apply, or ``None`` when the pool already has that shape."""
    if sorted(current) == sorted(planned.degrees):
        return None
    counts = collections.Counter(planned.degrees)
    return PoolReshape(replicas=tuple(sorted(counts.items(), reverse=True)))


@dataclasses.dataclass(frozen=True)
class PoolShape:
    """One inference pool of the job as the planner sees it (the operator converts ``spec.pools``)."""

    name: str
    tp: int
    replicas: int


MAX_POOL_NAME = 16
"""RolloutJob pool names are at most this long (``treadle.api.v1alpha1.MAX_POOL_NAME``)."""


def pools_after(pools: Sequence[PoolShape], reshape: PoolReshape, *, base_name: str) -> tuple[PoolShape, ...]:
    """The agent's pools with the reshape applied: what the operator writes back to the RolloutJob.

    A pool keeps its name and TP degree and takes the planned replica count for that degree (0 if
    the plan has none, so its pods scale away while the name stays stable); a planned degree with
    no pool gets a new pool ``<base_name>-tp<g>``. ``pools`` are the pools of one agent on one
    accelerator class, at most one per degree.
    """
    by_tp: dict[int, PoolShape] = {}
    for i, p in enumerate(pools):
        if p.tp in by_tp:
            raise SpecError(f"two pools with TP {p.tp}", field=f"pools[{i}].tp", value=p.tp)
        by_tp[p.tp] = p
    planned = dict(reshape.replicas)
    out = [dataclasses.replace(p, replicas=planned.get(p.tp, 0)) for p in pools]
    for g, replicas in reshape.replicas:
        if g not in by_tp:
            name = f"{base_name}-tp{g}"
            if len(name) > MAX_POOL_NAME:
                raise SpecError(
                    f"{name!r} is longer than {MAX_POOL_NAME}", field="base_name", value=base_name
                )
            out.append(PoolShape(name=name, tp=g, replicas=replicas))
    return tuple(sorted(out, key=lambda p: (-p.tp, p.name)))


class _Scorer:
    """Memoised score per allocation; reuses validated worker profiles across calls."""

    def __init__(
        self, lengths: Sequence[float], profiles: Mapping[int, DegreeProfile], busy_weight: float
    ) -> None:
        self.lengths = list(lengths)
        self.counts = [1] * len(self.lengths)
        self.profiles = profiles
        self.busy_weight = busy_weight
        self.workers: dict[int, list[presorted_dp.WorkerProfile]] = {}
        self.memo: dict[tuple[int, ...], Score] = {}

    def score(self, degrees: tuple[int, ...]) -> Score:
        if degrees not in self.memo:
            workers: list[presorted_dp.WorkerProfile] = []
            for g, n in sorted(collections.Counter(degrees).items(), reverse=True):
                workers.extend(self._workers(g, n))
            try:
                optimum = presorted_dp.solve(self.lengths, self.counts, workers).makespan
            except SpecError:  # the batch does not fit this allocation's largest groups
                self.memo[degrees] = Score(math.inf, math.inf, math.inf)
                return self.memo[degrees]
            part = presorted_dp.balanced(optimum, self.lengths, self.counts, workers)
            if all(self.profiles[w.tp].step_times for w in workers):
                costs = self._simulated(part, workers)
            else:
                costs = presorted_dp.group_costs(part, self.lengths, self.counts, workers)
            makespan = max(costs)
            busy = sum(w.tp * c for w, c in zip(workers, costs, strict=True)) / sum(degrees)
            self.memo[degrees] = Score(makespan, busy, makespan + self.busy_weight * busy)
        return self.memo[degrees]

    def _simulated(
        self, part: presorted_dp.Partition, workers: Sequence[presorted_dp.WorkerProfile]
    ) -> list[float]:
        """Seconds every worker needs for the members the DP placed on it, by fluid simulation.

        Eq. (2) prices a group with a table ``I(|G|)`` profiled on the *batch's* shape, i.e. as if
        the group were a few long trajectories and many tiny ones. That is true of the head's group
        only: a later contiguous group (Lemma 5.1) holds members of similar length, which run in
        KV-bound waves, so the table under-prices it by several times and the DP hands narrow
        workers hundreds of them. Simulating the group's own shape (the paper's profiler method,
        applied to the group instead of the batch) prices what the placement will actually run.
        """
        out: list[float] = []
        start = 0
        for worker, end in zip(workers, part.ends, strict=True):
            head = self.lengths[start] if end > start else 0.0
            shape = [x / head for x in self.lengths[start:end] if x > 0] if head > 0 else []
            if shape:
                steps = self.profiles[worker.tp].step_times
                table = presorted_dp.interference_by_simulation(steps, shape, max_group=len(shape), grid=2)
                out.append(head * steps[0] * table[-1])
            else:
                out.append(0.0)
            start = end
        return out

    def _workers(self, g: int, n: int) -> list[presorted_dp.WorkerProfile]:
        have = self.workers.setdefault(g, [])
        p = self.profiles[g]
        while len(have) < n:
            have.append(presorted_dp.WorkerProfile(f"tp{g}-{len(have)}", p.t_base, p.interference, tp=g))
        return have[:n]


def _sample(gpus: int, degrees: Sequence[int], rng: random.Random) -> tuple[int, ...]:
    out: list[int] = []
    left = gpus
    while left > 0:
        out.append(rng.choice([g for g in degrees if g <= left]))
        left -= out[-1]
    return tuple(sorted(out, reverse=True))


def _perturb(current: tuple[int, ...], allowed: set[int], rng: random.Random) -> tuple[int, ...] | None:
    """One random split, merge or redistribution; ``None`` when no move exists."""
    counts = collections.Counter(current)
    splittable = sorted(g for g in counts if g // 2 in allowed and g % 2 == 0)
    mergeable = sorted(g for g, n in counts.items() if n >= 2 and 2 * g in allowed)
    moves: list[tuple[str, int, int]] = [("split", g, 0) for g in splittable]
    moves += [("merge", g, 0) for g in mergeable]
    for s in splittable:
        for h in sorted(g for g in counts if 2 * g in allowed):
            # the pair to merge must come from the other workers, and merging two halves of the
            # split worker's size would give back the same allocation
            if h != s // 2 and counts[h] - (1 if h == s else 0) >= 2:
                moves.append(("redistribute", s, h))
    if not moves:
        return None
    kind, g, h = rng.choice(moves)
    if kind in ("split", "redistribute"):
        counts[g] -= 1
        counts[g // 2] += 2
    if kind == "merge":
        counts[g] -= 2
        counts[2 * g] += 1
    if kind == "redistribute":
        counts[h] -= 2
        counts[2 * h] += 1
    return tuple(sorted(counts.elements(), reverse=True))


def _check(gpus: int, profiles: Sequence[DegreeProfile], annealing: Annealing) -> dict[int, DegreeProfile]:
    by_tp: dict[int, DegreeProfile] = {}
    for i, p in enumerate(profiles):
        if p.tp < 1 or p.tp in by_tp:
            raise SpecError("must be a distinct degree >= 1", field=f"profiles[{i}].tp", value=p.tp)
        by_tp[p.tp] = p
    if not by_tp:
        raise SpecError("at least one TP degree is needed", field="profiles", value=[])
    smallest = min(by_tp)
    if any(g % smallest for g in by_tp):
        raise SpecError(
            "every degree must be a multiple of the smallest", field="profiles", value=sorted(by_tp)
        )
    if gpus < smallest or gpus % smallest:
        raise SpecError(f"must be a positive multiple of {smallest}", field="gpus", value=gpus)
    if not annealing.busy_weight >= 0:
        raise SpecError("must be >= 0", field="annealing.busy_weight", value=annealing.busy_weight)
    if not 0 < annealing.cooling < 1:
        raise SpecError("must be in (0, 1)", field="annealing.cooling", value=annealing.cooling)
    if not 0 < annealing.min_temperature_ratio < 1:
        raise SpecError(
            "must be in (0, 1)",
            field="annealing.min_temperature_ratio",
            value=annealing.min_temperature_ratio,
        )
    for name in ("moves_per_temperature", "max_evaluations"):
        if getattr(annealing, name) < 1:
            raise SpecError("must be at least 1", field=f"annealing.{name}", value=getattr(annealing, name))
    return by_tp
