"""Benchmark: Heddle presorted-DP placement time for a rollout batch (Heddle Table 2: ~36-38 ms).

Run: ``python bench/policy_heddle_placement.py [--trajectories 1024] [--workers 64] [--out DIR]``.
Times ``presorted_dp.plan`` (parametric search, the default), the same with the Eq. (3) DP
(``exact_dp``), and with short-trajectory merging, on lognormal predicted lengths and an
interference table simulated (``interference_by_simulation``, the paper's method) from the
roofline cost model's decode steps (Qwen3-14B, H800, TP 1, up to 100 running) and the lengths' shape.
Prints figures only; nothing is asserted. Writes ``config.json`` and ``results.json`` to ``--out``.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import random
import statistics
from collections.abc import Callable

import benchcli

from treadle.policy import costmodel
from treadle.policy.heddle import presorted_dp

PAPER_MS = (36.0, 38.0)


@dataclasses.dataclass(frozen=True)
class Config:
    trajectories: int = dataclasses.field(default=1024, metadata={"help": "trajectories in the batch"})
    workers: int = dataclasses.field(default=64, metadata={"help": "identical rollout workers (TP 1)"})
    repeats: int = dataclasses.field(
        default=50, metadata={"help": "timed runs per variant; the median is reported"}
    )
    context_tokens: int = dataclasses.field(
        default=4096, metadata={"help": "mean context per running sequence when profiling decode steps"}
    )
    max_running: int = dataclasses.field(
        default=100, metadata={"help": "running batch cap per worker (the paper's baselines use 100)"}
    )
    seed: int = dataclasses.field(default=0, metadata={"help": "seed of the lognormal predicted lengths"})
    out: str = dataclasses.field(
        default="", metadata={"help": "directory for config.json and results.json (empty: write none)"}
    )


def profile(cfg: Config, shape: list[float]) -> tuple[float, tuple[float, ...]]:
    steps = [
        costmodel.decode_step_time(
            costmodel.H800, costmodel.QWEN3_14B, batch=b, context_tokens=b * cfg.context_tokens, tp=1
        )
        for b in range(1, cfg.max_running + 1)
    ]
    return steps[0], presorted_dp.interference_by_simulation(steps, shape, max_group=cfg.trajectories)


def main() -> None:
    cfg = benchcli.parse(Config, __doc__)
    rng = random.Random(cfg.seed)
    trajs = [presorted_dp.Trajectory(f"t{i}", rng.lognormvariate(8.0, 1.0)) for i in range(cfg.trajectories)]
    longest = max(t.predicted_length for t in trajs)
    t_base, table = profile(cfg, [t.predicted_length / longest for t in trajs])
    workers = [presorted_dp.WorkerProfile(f"w{j}", t_base, table) for j in range(cfg.workers)]
    p50 = statistics.median(t.predicted_length for t in trajs)
    merge = presorted_dp.Merge(below=p50, block=8)
    variants: dict[str, Callable[[], presorted_dp.Placement]] = {
        "plan (parametric, default)": lambda: presorted_dp.plan(trajs, workers),
        "plan with merging (< p50, blocks of 8)": lambda: presorted_dp.plan(trajs, workers, merge=merge),
        "plan with the Eq. (3) DP (bisected k)": lambda: presorted_dp.plan(trajs, workers, exact_dp=True),
    }
    results = {}
    print(
        f"Heddle placement, {cfg.trajectories} trajectories on {cfg.workers} workers (pure Python, this host)"
    )
    paper = f"paper: {PAPER_MS[0]}-{PAPER_MS[1]} ms"
    print(f"{'variant':40} {'median ms':>10} {'min ms':>7} {'makespan s':>11}   {paper}")
    for name, fn in variants.items():
        med, best = benchcli.timed_ms(fn, cfg.repeats if "Eq." not in name else max(3, cfg.repeats // 10))
        makespan = fn().makespan
        results[name] = {"median_ms": med, "min_ms": best, "predicted_makespan_s": makespan}
        print(f"{name:40} {med:10.2f} {best:7.2f} {makespan:11.1f}")
    if cfg.out:
        out = pathlib.Path(cfg.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(json.dumps(dataclasses.asdict(cfg), indent=2))
        (out / "results.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
