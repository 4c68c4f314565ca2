"""What the live Heddle benches see of a step beside its time: probes, engine counters, intervals.

Used by ``bench/heddle_live.py`` (SIMULATED engine) and ``bench/heddle_vllm.py`` (real vLLM).
Probes (``--probe-s``): the placement service's outstanding turns per worker and the scheduler's
``ListTrajectories`` (worker, tokens so far, predicted remaining), sampled during each step, and
each trajectory's finish time from the results stream. Engine counters: vLLM's own
``vllm:iteration_tokens_total`` histogram (its ``_count`` is the engine steps run, its ``_sum``
the tokens they processed; ``treadle.services.fakevllm`` exports the same) and the prefix cache's
queries and hits, read from every engine's ``/metrics`` before and after each step. Intervals: a
configuration's rounds paired with the baseline's (and full Heddle's with Heddle scheduling's),
``treadle.policy.paired.ratio_interval``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import math
import os
import statistics
import time
from collections.abc import Sequence
from typing import Any

import httpx

from treadle.policy import paired
from treadle.services.agent import service as agent_service

COUNTERS = {
    "queries": "vllm:prefix_cache_queries_total",
    "hits": "vllm:prefix_cache_hits_total",
    "engine_steps": "vllm:iteration_tokens_total_count",
    "engine_tokens": "vllm:iteration_tokens_total_sum",
}
"""What ``engine_counters`` sums over the engines, by its key in results.json."""
PAIRS = (
    ("priority-global", "baseline", "ordering"),
    ("heddle-sched", "priority-global", "preemption"),
    ("heddle", "heddle-sched", "placement + migration"),
    ("heddle-place", "baseline", "placement + migration, FIFO order"),
)
"""(configuration, the one it adds a mechanism to, the mechanism): each mechanism's share is the ratio
of a configuration to its neighbour without that mechanism, where both ran."""


@dataclasses.dataclass
class StepProbe:
    """What one rollout step looked like from outside: sampled every ``--probe-s`` seconds."""

    began: float
    load: list[tuple[float, dict[str, int]]] = dataclasses.field(default_factory=list)
    """(seconds into the step, turns outstanding per worker) from the placement service."""
    predicted: dict[tuple[str, int], float] = dataclasses.field(default_factory=dict)
    """(trajectory, tokens so far) -> the scheduler's predicted remaining tokens at that point."""
    workers: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    """Trajectory -> the workers its turns were seen on, in order."""


async def probe(pc: Any, sc: Any, p: StepProbe, every_s: float) -> None:
    """Sample load, predictions and workers until cancelled."""
    while True:
        pool, listed = await asyncio.gather(pc.pool_state(), sc.list_trajectories(limit=1_000_000))
        now = time.monotonic() - p.began
        p.load.append((now, {w.worker.worker_id: w.outstanding for w in pool.workers}))
        for t in listed.trajectories:
            p.predicted.setdefault((t.trajectory_id, t.tokens_so_far), t.predicted_remaining)
            seen = p.workers.setdefault(t.trajectory_id, [])
            if t.worker_id and (not seen or seen[-1] != t.worker_id):
                seen.append(t.worker_id)
        await asyncio.sleep(every_s)


async def collect(sc: Any, finished: dict[str, tuple[float, int, int]], stored: asyncio.Event) -> None:
    """Every stored trajectory: id -> (monotonic time stored, output tokens, turns)."""
    async for r in sc.results():
        finished[r.trajectory_id] = (time.monotonic(), r.output_tokens, r.turns)
        stored.set()


def summarise(
    p: StepProbe, finished: dict[str, tuple[float, int, int]], step: int, tokens: int
) -> dict[str, Any]:
    """One step's load per worker, completion profile, trajectories per worker and predictor error."""
    mine = {tid: f for tid, f in finished.items() if tid.startswith(f"s{step}-")}
    ends = sorted(at - p.began for at, _, _ in mine.values())
    workers = sorted({w for _, load in p.load for w in load})
    spans = [b[0] - a[0] for a, b in itertools.pairwise(p.load)]
    span = sum(spans) or 1.0
    mean_load = {
        w: sum(d * a[1].get(w, 0) for d, a in zip(spans, p.load, strict=False)) / span for w in workers
    }
    gap = (
        sum(d * (max(a[1].values()) - min(a[1].values())) for d, a in zip(spans, p.load, strict=False)) / span
    )
    by_worker: dict[str, dict[str, int]] = {w: {"trajectories": 0, "turns": 0, "moved": 0} for w in workers}
    for tid, seen in p.workers.items():
        if tid in mine and seen:
            row = by_worker.setdefault(seen[-1], {"trajectories": 0, "turns": 0, "moved": 0})
            row["trajectories"] += 1
            row["turns"] += mine[tid][2]
            row["moved"] += len(seen) > 1
    longest = sorted(mine, key=lambda tid: -mine[tid][2])[:6]
    errors: dict[int, list[tuple[float, float]]] = {}
    for (tid, so_far), predicted in p.predicted.items():
        if tid in mine:
            errors.setdefault(so_far // tokens, []).append((predicted, mine[tid][1] - so_far))
    return {
        "load_mean": {w: round(x, 2) for w, x in mean_load.items()},
        "load_gap_mean": round(gap, 2),
        "done_at_s": {
            str(q): round(ends[min(len(ends) - 1, int(q / 100 * len(ends)))], 2) for q in (50, 90, 99)
        }
        if ends
        else {},
        "last_s": round(ends[-1], 2) if ends else None,
        "by_worker": by_worker,
        "longest": {
            tid: {
                "turns": mine[tid][2],
                "workers": p.workers.get(tid, []),
                "done_s": round(mine[tid][0] - p.began, 2),
            }
            for tid in longest
        },
        "prediction_error": {k: _error(v) for k, v in sorted(errors.items())},
    }


def _error(pairs: list[tuple[float, float]]) -> dict[str, float]:
    """|predicted - actual| remaining tokens: median, mean, and MAPE where the actual is positive."""
    absolute = [abs(pr - ac) for pr, ac in pairs]
    relative = [abs(pr - ac) / ac for pr, ac in pairs if ac > 0]
    return {
        "n": len(pairs),
        "median_abs": round(statistics.median(absolute), 1),
        "mean_abs": round(statistics.mean(absolute), 1),
        "mape": round(statistics.mean(relative), 3) if relative else math.nan,
        "mean_actual": round(statistics.mean(ac for _, ac in pairs), 1),
    }


def report_probes(results: dict[str, Any]) -> None:
    """The warm steps' probes per configuration, then the predictor's error by turns done."""
    errors: dict[int, list[dict[str, float]]] = {}
    for name, runs in results["configs"].items():
        probes = [p for r in runs for p in r.get("probes", [])[1:]]
        if not probes:
            continue
        workers = sorted(probes[0]["load_mean"])
        load = " / ".join(f"{statistics.mean(p['load_mean'][w] for p in probes):.1f}" for w in workers)
        held = " / ".join(
            f"{statistics.mean(p['by_worker'][w]['trajectories'] for p in probes):.0f}:"
            f"{statistics.mean(p['by_worker'][w]['turns'] for p in probes):.0f}"
            for w in workers
        )
        first = statistics.mean(
            sum(v["workers"][-1:] == workers[:1] for v in p["longest"].values()) for p in probes
        )
        done = statistics.mean(v["done_s"] for p in probes for v in p["longest"].values())
        print(f"  {name:17s} outstanding {' / '.join(workers)} {load} (gap "
              f"{statistics.mean(p['load_gap_mean'] for p in probes):.1f}); trajectories:turns {held}; "
              f"longest 6 on {workers[0]} {first:.1f}, done at {done:.2f} s; migrations/step "
              f"{statistics.mean(p['migrations'] for p in probes):.0f}; half done at "
              f"{statistics.mean(p['done_at_s']['50'] for p in probes):.2f} s")  # fmt: skip
        for p in probes:
            for k, e in p["prediction_error"].items():
                errors.setdefault(int(k), []).append(e)
    if errors:
        print("predictor error, warm steps, |predicted - actual| remaining tokens by turns done k (some k):")
        for k in sorted(k for k in errors if k <= 5 or k % 10 == 0):
            es = errors[k]
            mape = [e["mape"] for e in es if not math.isnan(e["mape"])]
            print(f"  k {k:3d}: n {sum(int(e['n']) for e in es):5d}  median "
                  f"{statistics.median(e['median_abs'] for e in es):7.1f}  MAPE "
                  f"{statistics.median(mape) if mape else math.nan:5.2f}")  # fmt: skip


def load() -> str:
    """The 1-, 5- and 15-minute load averages: the host is shared, every figure carries them."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


async def engine_counters(engines: Sequence[str], *, reset: bool = False) -> dict[str, float]:
    """``COUNTERS`` summed over the engines; ``reset`` first empties their prefix caches."""
    total = dict.fromkeys(COUNTERS, 0.0)
    async with httpx.AsyncClient(timeout=10.0) as http:
        for url in engines:
            if reset:
                (await http.post(f"{url}/reset_prefix_cache")).raise_for_status()
            got = agent_service.parse_metrics((await http.get(f"{url}/metrics")).text)
            for key, name in COUNTERS.items():
                total[key] += got.get(name, 0.0)
    return total


def round_means(runs: Sequence[dict[str, Any]]) -> dict[int, float]:
    """Round -> the mean of that round's warm steps (the pairing unit: one value per round)."""
    return {r["round"]: statistics.mean(r["measured_s"]) for r in runs}


def interval(results: dict[str, Any], reference: str, name: str) -> paired.RatioInterval | None:
    """``reference`` / ``name`` over the rounds both ran (above 1: ``name`` is faster)."""
    ref, cand = (round_means(results["configs"].get(n, [])) for n in (reference, name))
    rounds = sorted(set(ref) & set(cand))
    return paired.ratio_interval([ref[r] for r in rounds], [cand[r] for r in rounds]) if rounds else None


def report_intervals(results: dict[str, Any]) -> None:
    """Every configuration against the baseline, the mechanism pairs, and the engines' own counts."""
    print("ratios, paired per round (reference mean warm step / this one's; above 1: faster), 95 % t "
          "interval on the log ratios:")  # fmt: skip
    for name, runs in results["configs"].items():
        pairs = [(ref, what) for n, ref, what in PAIRS if n == name]
        if name != "baseline" and all(ref != "baseline" for ref, _ in pairs):
            pairs.insert(0, ("baseline", "all of it"))
        for ref, what in pairs:
            got = interval(results, ref, name)
            if got is not None:
                print(f"  {name:17s} vs {ref:15s} ({what}): {got}")
        warm = [c for r in runs for c in r.get("engine", [])[1:] if c["engine_steps"]]
        if warm:
            steps = statistics.mean(c["engine_steps"] for c in warm)
            total = sum(c["engine_steps"] for c in warm)
            batch = sum(c["engine_tokens"] for c in warm) / total
            # prefilled = looked up - hit; what is left of a step's tokens is one per decoding sequence
            decode = sum(c["engine_tokens"] - (c["queries"] - c["hits"]) for c in warm) / total
            print(f"  {name:17s} engines: {steps:,.0f} steps a warm step (all engines), tokens a step "
                  f"{batch:.1f}, of them decoding sequences {decode:.1f}")  # fmt: skip
