"""The makespan lower bound against brute-force optima of tiny instances."""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence

import pytest

from treadle.policy import bounds

Seg = bounds.Segment


def gpu(**per_pool: float) -> bounds.Segment:
    """A GPU segment whose work equals its latency (no batching: a worker runs one at a time)."""
    return Seg(latency=per_pool, work=per_pool)


def brute_force(chains: Sequence[bounds.Chain], workers: dict[str, int]) -> float:
    """Optimal makespan: every assignment of GPU segments to workers and every order per worker.

    Workers run one segment at a time, waits need no worker, chains run in order. Each (assignment,
    per-worker order) gives the earliest start times by longest path; infeasible orders (cycles)
    are skipped. Exhaustive, so only for a handful of segments.
    """
    slots = [(p, i) for p, n in workers.items() for i in range(n)]
    gpu_segs = [(c, s) for c, chain in enumerate(chains) for s, seg in enumerate(chain) if seg.latency]
    best = float("inf")
    for assignment in itertools.product(slots, repeat=len(gpu_segs)):
        if any(
            slot[0] not in chains[c][s].latency for slot, (c, s) in zip(assignment, gpu_segs, strict=True)
        ):
            continue
        per_slot: dict[tuple[str, int], list[tuple[int, int]]] = {}
        for slot, seg in zip(assignment, gpu_segs, strict=True):
            per_slot.setdefault(slot, []).append(seg)
        for orders in itertools.product(*(itertools.permutations(v) for v in per_slot.values())):
            makespan = _evaluate(chains, dict(zip(gpu_segs, assignment, strict=True)), orders)
            best = min(best, makespan)
    return best


def _evaluate(
    chains: Sequence[bounds.Chain],
    slot_of: dict[tuple[int, int], tuple[str, int]],
    orders: tuple[tuple[tuple[int, int], ...], ...],
) -> float:
    prev_on_slot = {}
    for order in orders:
        for a, b in itertools.pairwise(order):
            prev_on_slot[b] = a
    finish: dict[tuple[int, int], float] = {}
    pending = [(c, s) for c, chain in enumerate(chains) for s in range(len(chain))]
    progress = True
    while pending and progress:
        progress = False
        for key in list(pending):
            c, s = key
            deps = [(c, s - 1)] if s else []
            if key in prev_on_slot:
                deps.append(prev_on_slot[key])
            if all(d in finish for d in deps):
                start = max((finish[d] for d in deps), default=0.0)
                seg = chains[c][s]
                dur = seg.latency[slot_of[key][0]] if seg.latency else seg.wait_s
                finish[key] = start + dur
                pending.remove(key)
                progress = True
    return max(finish.values()) if not pending else float("inf")


CASES = {
    # one chain: the critical path is the optimum
    "single-chain": ([[gpu(a=2.0), Seg(wait_s=1.0), gpu(a=3.0)]], {"a": 2}, 6.0),
    # four equal independent jobs on two workers: total work / workers is the optimum
    "even-split": ([[gpu(a=1.0)] for _ in range(4)], {"a": 2}, 2.0),
    # heterogeneous: each job on its fast pool, one worker each
    "two-pools": ([[gpu(fast=1.0, slow=3.0)], [gpu(fast=3.0, slow=1.0)]], {"fast": 1, "slow": 1}, 1.0),
}


@pytest.mark.parametrize("chains,workers,optimum", CASES.values(), ids=list(CASES))
def test_bound_is_tight_where_it_should_be(
    chains: list[bounds.Chain], workers: dict[str, int], optimum: float
) -> None:
    assert brute_force(chains, workers) == pytest.approx(optimum)
    assert bounds.lower_bound(chains, workers)["bound"] == pytest.approx(optimum)


@pytest.mark.parametrize("seed", range(40))
def test_bound_never_exceeds_the_brute_force_optimum(seed: int) -> None:
    rng = random.Random(seed)
    pools = {"a": rng.randint(1, 2), "b": rng.randint(0, 1)}
    chains = []
    for _ in range(rng.randint(1, 3)):
        chain: list[bounds.Segment] = []
        for s in range(rng.randint(1, 2)):
            if s:
                chain.append(Seg(wait_s=round(rng.uniform(0, 2), 2)))
            chain.append(gpu(a=round(rng.uniform(0.5, 3), 2), b=round(rng.uniform(0.5, 3), 2)))
        chains.append(chain)
    live = {p: n for p, n in pools.items() if n}
    optimum = brute_force(chains, live)
    parts = bounds.lower_bound(chains, live)
    assert parts["bound"] <= optimum + 1e-9
    assert parts["bound"] == max(parts["work"], parts["critical_path"], parts["serial"])


def test_batching_makes_work_smaller_than_latency() -> None:
    # ten turns that each take 1 s alone but only 0.1 worker-s batched: the bound drops from 5 s to 1 s
    chains = [[Seg(latency={"a": 1.0}, work={"a": 0.1})] for _ in range(10)]
    parts = bounds.lower_bound(chains, {"a": 1})
    assert parts["work"] == pytest.approx(1.0)
    assert parts["critical_path"] == pytest.approx(1.0)


def test_serial_floor_and_empty_inputs() -> None:
    assert bounds.lower_bound([], {"a": 1}, serial_s=7.0)["bound"] == 7.0
    assert bounds.work_bound([[gpu(a=1.0)]], {}) == float("inf")
    assert bounds.critical_path([[Seg(wait_s=2.0)]]) == 2.0
