"""Simulator speed at cluster scale: a 3,000-GPU, ~50,000-trajectory RollArt rollout (simulated).

Prints events, wall and CPU seconds, events per CPU second and peak memory, and writes
``config.json`` and ``results.json`` to ``--out``. CPU time is the figure to read on a shared
machine: wall time there counts other processes' turns too.

    ~/.cache/treadle/venv/bin/python bench/sim_scale.py [--scenario ...] [--steps 5] [--seed 11]
"""

from __future__ import annotations

import dataclasses
import json
import resource
import time
from pathlib import Path

import benchcli

from treadle.sim import kinds, scenario
from treadle.sim.kinds import rollart


@dataclasses.dataclass(frozen=True)
class Config:
    scenario: str = dataclasses.field(
        default="bench/scenarios/scale-3000gpu.yaml", metadata={"help": "scenario file to simulate"}
    )
    run: str = dataclasses.field(default="rollart", metadata={"help": "system or variant to run"})
    steps: int = dataclasses.field(default=5, metadata={"help": "training steps (batch 10,000 each)"})
    seed: int = dataclasses.field(default=11, metadata={"help": "the run's random seed"})
    out: str = dataclasses.field(default="out/sim/scale", metadata={"help": "output directory"})


def main() -> None:
    cfg = benchcli.parse(Config, __doc__)

    plan = rollart.parse(scenario.read(cfg.scenario))
    run_cfg = plan.scenario.config(cfg.run, steps=cfg.steps, seed=cfg.seed)
    gpus = sum(p.replicas * p.tensor_parallel_size for p in run_cfg.job.spec.pools) + run_cfg.training.gpus
    wall0, cpu0 = time.perf_counter(), time.process_time()
    # the run as ``treadle simulate`` makes it (the kind builds the same config again: milliseconds)
    (result,) = plan.run(kinds.Options(runs=(cfg.run,), steps=cfg.steps, seed=cfg.seed)).results
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    figures = {
        "label": "simulated",
        "gpus": gpus,
        "trajectories_started": result.started,
        "trajectories_trained": result.trained,
        "events": result.events,
        "wall_s": wall,
        "cpu_s": cpu,
        "events_per_cpu_s": result.events / cpu,
        "peak_rss_mib": peak_mib,
        "simulated_s": result.total_s,
    }
    print(f"SIMULATED scale run: {cfg.scenario} ({cfg.run}, {cfg.steps} steps, seed {cfg.seed})")
    for key, value in figures.items():
        print(f"  {key:22s} {value:,.1f}" if isinstance(value, float) else f"  {key:22s} {value}")
    print("  target                 < 60 s for 3,000 GPUs and 50,000 trajectories (CPU time on this machine)")
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(dataclasses.asdict(cfg), indent=2) + "\n")
    (out / "results.json").write_text(
        json.dumps({"figures": figures, "run": result.summary()}, indent=2) + "\n"
    )


if __name__ == "__main__":
    main()
