"""Benchmark: Heddle trajectory-adaptive TP planner for 64 GPUs (Heddle Table 2: 4.97-5.69 s).

Run: ``python bench/policy_heddle_tp.py [--gpus 64] [--trajectories 1024] [--seeds 3] [--out DIR]``.
Times ``tp_planner.plan`` (simulated annealing over TP degrees {1, 2, 4, 8}, one presorted DP per
distinct allocation) on lognormal predicted lengths, with per-degree profiles from the roofline
cost model (Qwen3-14B on H800; running sequences capped by each degree's KV capacity at a 4K-token
context, and by 256), ``I_g(s)`` simulated from them and
the lengths' shape (``presorted_dp.interference_by_simulation``). Beside the time it prints the
planned allocation and its predicted makespan next to Fix-1 and Fix-8, the paper's ablation
extremes; these makespans are the planner's own estimate (the DP's placement, each group's decode
simulated from the step times: ``tp_planner``'s score), not the event simulator. Nothing asserted.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import pathlib
import random
import time

import benchcli

from treadle.policy import costmodel
from treadle.policy.heddle import presorted_dp, tp_planner

PAPER_S = (4.97, 5.69)


@dataclasses.dataclass(frozen=True)
class Config:
    gpus: int = dataclasses.field(default=64, metadata={"help": "GPU budget split into workers"})
    trajectories: int = dataclasses.field(
        default=1024, metadata={"help": "trajectories in the batch whose predicted lengths drive the plan"}
    )
    seeds: int = dataclasses.field(default=3, metadata={"help": "annealing seeds timed (0..seeds-1)"})
    context_tokens: int = dataclasses.field(
        default=4096, metadata={"help": "mean context per running sequence when profiling decode steps"}
    )
    max_running: int = dataclasses.field(
        default=256,
        metadata={"help": "running batch cap per worker (vLLM's max_num_seqs); KV capacity may bind first"},
    )
    workload_seed: int = dataclasses.field(
        default=0, metadata={"help": "seed of the lognormal predicted lengths"}
    )
    out: str = dataclasses.field(
        default="", metadata={"help": "directory for config.json and results.json (empty: write none)"}
    )


def profiles(cfg: Config, shape: list[float]) -> list[tp_planner.DegreeProfile]:
    out = []
    for g in (1, 2, 4, 8):
        # a worker of g GPUs holds g times the KV cache: it runs more sequences at once
        kv = costmodel.kv_capacity_tokens(costmodel.H800, costmodel.QWEN3_14B, tp=g)
        running = max(1, min(cfg.max_running, kv // cfg.context_tokens))
        steps = [
            costmodel.decode_step_time(
                costmodel.H800, costmodel.QWEN3_14B, batch=b, context_tokens=b * cfg.context_tokens, tp=g
            )
            for b in range(1, running + 1)
        ]
        table = presorted_dp.interference_by_simulation(steps, shape, max_group=cfg.trajectories)
        out.append(tp_planner.DegreeProfile(g, steps[0], table, step_times=tuple(steps)))
    return out


def main() -> None:
    cfg = benchcli.parse(Config, __doc__)
    rng = random.Random(cfg.workload_seed)
    lengths = [rng.lognormvariate(8.0, 1.0) for _ in range(cfg.trajectories)]
    profs = profiles(cfg, [x / max(lengths) for x in lengths])
    print(f"Heddle TP planner, {cfg.gpus} GPUs, {cfg.trajectories} trajectories (pure Python, this host)")
    print(f"paper: {PAPER_S[0]}-{PAPER_S[1]} s per run")
    results: dict[str, object] = {}
    for seed in range(cfg.seeds):
        start = time.perf_counter()
        plan = tp_planner.plan(
            lengths, gpus=cfg.gpus, profiles=profs, annealing=tp_planner.Annealing(seed=seed)
        )
        seconds = time.perf_counter() - start
        shape = dict(sorted(collections.Counter(plan.degrees).items(), reverse=True))
        results[f"seed{seed}"] = {
            "seconds": seconds,
            "evaluations": plan.evaluations,
            "makespan_s": plan.makespan,
            "degrees": shape,
        }
        print(
            f"seed {seed}: {seconds:6.2f} s, {plan.evaluations} DPs, TP x replicas {shape}, "
            f"predicted makespan {plan.makespan:.1f} s (start {plan.start_makespan:.1f} s)"
        )
    for g in (1, 8):
        score = tp_planner.cost(lengths, (g,) * (cfg.gpus // g), profs)
        results[f"fix{g}"] = {"makespan_s": score.makespan, "busy_s": score.busy}
        print(f"Fix-{g}: predicted makespan {score.makespan:.1f} s, mean GPU-busy {score.busy:.1f} s")
    if cfg.out:
        out = pathlib.Path(cfg.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(json.dumps(dataclasses.asdict(cfg), indent=2))
        (out / "results.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
