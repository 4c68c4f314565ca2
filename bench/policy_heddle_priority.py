"""Benchmark: Heddle progressive-priority update per trajectory step (target < 50 us).

Run: ``python bench/policy_heddle_priority.py [--waiting 100] [--steps 20000] [--out DIR]``.
One step update is what the scheduler does at a step boundary: predict the remaining length
(``predictor.HistoryModel.predict`` over a 2,048-trajectory window), re-insert the request into the
worker's ordered waiting queue (``priority.insert``) and run one Algorithm 1 decision on a full
worker (``priority.next_action``). Timed per part and in total, median and p99 over ``--steps``.
Prints figures only; nothing is asserted.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import random
import statistics
import time

import benchcli

from treadle.policy.heddle import predictor, priority

TARGET_US = 50.0


@dataclasses.dataclass(frozen=True)
class Config:
    waiting: int = dataclasses.field(default=100, metadata={"help": "requests waiting at the worker"})
    running: int = dataclasses.field(
        default=100,
        metadata={"help": "requests running at the worker (all slots full, so a decision may preempt)"},
    )
    history: int = dataclasses.field(
        default=2048, metadata={"help": "finished trajectories the predictor has learned"}
    )
    steps: int = dataclasses.field(default=20_000, metadata={"help": "step updates timed"})
    seed: int = dataclasses.field(default=0, metadata={"help": "seed of the synthetic history and requests"})
    out: str = dataclasses.field(
        default="", metadata={"help": "directory for config.json and results.json (empty: write none)"}
    )


def main() -> None:
    cfg = benchcli.parse(Config, __doc__)
    rng = random.Random(cfg.seed)
    finished = [
        predictor.Finished("code", f"g{i // 16}", int(rng.lognormvariate(8, 1))) for i in range(cfg.history)
    ]
    model = predictor.learn(predictor.HistoryModel(), finished)
    waiting: tuple[priority.Request, ...] = ()
    for i in range(cfg.waiting):
        waiting = priority.insert(waiting, priority.Request(f"w{i}", rng.uniform(0, 5000), i))
    running = tuple(
        priority.order(priority.Request(f"r{i}", rng.uniform(0, 5000), -i - 1) for i in range(cfg.running))
    )
    parts: dict[str, list[float]] = {"predict": [], "insert": [], "decide": [], "total": []}
    for step in range(cfg.steps):
        tid = f"w{rng.randrange(cfg.waiting)}"
        obs = predictor.Observation("code", f"g{rng.randrange(cfg.history // 16)}", rng.randrange(20_000))
        t0 = time.perf_counter()
        remaining = model.predict(obs)
        t1 = time.perf_counter()
        waiting = priority.insert(
            waiting, priority.Request(tid, remaining, cfg.waiting + step, obs.tokens_so_far)
        )
        t2 = time.perf_counter()
        priority.next_action(priority.WorkerQueue(running=running, waiting=waiting, slots=cfg.running))
        t3 = time.perf_counter()
        for name, dt in (("predict", t1 - t0), ("insert", t2 - t1), ("decide", t3 - t2), ("total", t3 - t0)):
            parts[name].append(dt * 1e6)
    results = {}
    print(f"Heddle priority update per step: {cfg.waiting} waiting, {cfg.running} running (pure Python)")
    print(f"{'part':10} {'median us':>10} {'p99 us':>9}   target: < {TARGET_US:.0f} us per step")
    for name, samples in parts.items():
        samples.sort()
        med, p99 = statistics.median(samples), samples[int(0.99 * len(samples))]
        results[name] = {"median_us": med, "p99_us": p99}
        print(f"{name:10} {med:10.1f} {p99:9.1f}")
    if cfg.out:
        out = pathlib.Path(cfg.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(json.dumps(dataclasses.asdict(cfg), indent=2))
        (out / "results.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
