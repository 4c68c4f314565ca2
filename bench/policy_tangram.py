"""Decision time of ARL-Tangram's scheduler (``treadle.policy.tangram.schedule.decide``, Alg. 1-3).

One CPU node of 256 cores with 1,000 queued actions in FCFS order: four in five are tool calls
(one core, not scalable, historical-average durations), one in five a reward run (1-32 cores,
elasticity fitted by ``profile.fit`` from Amdahl samples with serial fraction 0.05, ``T_ori``
lognormal around 20 s); the busy cores run actions ending within 5 s. For each count of free
cores it times ``rounds`` decisions over freshly drawn queues and prints the median and the 99th
percentile, for the paper's whole-queue estimate (``horizon`` none) and our cap. Measured wall
time on this machine (shared; the load average is printed), not simulated.

    ~/.cache/treadle/venv/bin/python bench/policy_tangram.py [--rounds 200]
"""

from __future__ import annotations

import dataclasses
import os
import random
import statistics
import time

import benchcli

from treadle.policy.tangram import model, pools, profile, schedule

CORES = 256
QUEUED = 1000


@dataclasses.dataclass(frozen=True)
class Config:
    rounds: int = dataclasses.field(default=200, metadata={"help": "decisions timed per row"})
    seed: int = dataclasses.field(default=0, metadata={"help": "seed of the drawn queues"})
    depth: int = dataclasses.field(default=schedule.DEFAULT_DEPTH, metadata={"help": "Alg. 2 depth"})


def _queue(rng: random.Random, elasticity: model.Elasticity) -> list[model.Action]:
    out = []
    for i in range(QUEUED):
        if rng.random() < 0.2:
            cost = {"cpu": tuple(range(1, 33))}
            out.append(model.Action(f"r{i}", "cpu", cost, rng.lognormvariate(3.0, 0.8), elasticity))
        else:
            out.append(model.Action(f"t{i}", "cpu", {"cpu": (1,)}, rng.lognormvariate(-0.7, 1.2)))
    return out


def main() -> None:
    cfg = benchcli.parse(Config, __doc__)
    rng = random.Random(cfg.seed)
    elasticity = profile.fit([(m, 0.05 + 0.95 / m) for m in (1, 2, 4, 8, 16, 32)], 32)
    assert elasticity is not None
    print(f"schedule.decide, {QUEUED} queued actions, one node of {CORES} cores, depth {cfg.depth}")
    print("free cores  horizon  median ms  p99 ms  grants (median)")
    for free in (1, 8, 32, 64):
        for horizon in (None, 64):
            settings = schedule.Settings(depth=cfg.depth, horizon=horizon)
            times, grants = [], []
            for _ in range(cfg.rounds):
                waiting = _queue(rng, elasticity)
                running = [model.Running("cpu", 1, rng.uniform(0, 5)) for _ in range(CORES - free)]
                status = {"cpu": pools.FlatPool(free, CORES)}
                started = time.perf_counter()
                out = schedule.decide(waiting, running, status, settings)
                times.append(time.perf_counter() - started)
                grants.append(len(out))
            times.sort()
            print(
                f"{free:>10}  {horizon!s:>7}  {statistics.median(times) * 1e3:9.3f}  "
                f"{times[int(0.99 * (len(times) - 1))] * 1e3:6.3f}  {statistics.median(grants):>5.0f}",
                flush=True,
            )
    print(f"load average {os.getloadavg()[0]:.2f} (2 shared cores)")


if __name__ == "__main__":
    main()
