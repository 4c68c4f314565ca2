"""Benchmark: DARTS's per-step policy cost: Alg. 1 allocation for a batch, selection per group.

Run: ``python bench/policy_darts.py [--prompts 512] [--repeats 200] [--out DIR]``.
Times ``treadle.policy.darts.allocate`` for ``--prompts`` prompts between ``M`` and ``M_up`` at a low,
middle and high total budget, on lognormal per-prompt length stds (min-max normalised, as the
live path does) and on uniform weights (every prompt tied, the tie-break's worst case); the whole
per-step planning (``plan.pools``: ``stats.sigmas`` + ``normalise`` + ``budget.marginal_cost`` +
``total_budget`` + ``allocate``) once; and ``select_dual_end`` on one pool of ``M_up``. The target
is under 1 ms for the allocation of a 512-prompt batch (issue #15). Prints figures only; nothing is
asserted.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import random

import benchcli

from treadle.policy import costmodel, darts
from treadle.policy.darts import budget, plan, selection, stats

TARGET_MS = 1.0


@dataclasses.dataclass(frozen=True)
class Config:
    prompts: int = dataclasses.field(default=512, metadata={"help": "prompts in the batch (N)"})
    group: int = dataclasses.field(default=8, metadata={"help": "GRPO group size M"})
    m_up: int = dataclasses.field(default=16, metadata={"help": "per-prompt cap M_up"})
    repeats: int = dataclasses.field(default=200, metadata={"help": "timed runs; the median is reported"})
    seed: int = dataclasses.field(default=0, metadata={"help": "seed of the lognormal stds and lengths"})
    out: str = dataclasses.field(
        default="", metadata={"help": "directory for config.json and results.json (empty: write none)"}
    )


def main() -> None:
    cfg = benchcli.parse(Config, __doc__)
    rng = random.Random(cfg.seed)
    n, m, m_up = cfg.prompts, cfg.group, cfg.m_up
    sigmas = [rng.lognormvariate(6.5, 0.8) for _ in range(n)]
    weights = darts.normalise(sigmas)
    results: dict[str, tuple[float, float]] = {}
    for label, total in (("low", n * m + 1), ("middle", n * (m + m_up) // 2 + 7), ("high", n * m_up - 1)):
        results[f"allocate {label} budget ({total})"] = benchcli.timed_ms(
            lambda total=total: darts.allocate(weights, total, m, m_up), cfg.repeats
        )
        results[f"allocate {label} budget, all tied"] = benchcli.timed_ms(
            lambda total=total: darts.allocate([1.0] * n, total, m, m_up), cfg.repeats
        )
    observations = {
        str(p): stats.Observation(tuple(round(rng.lognormvariate(7.0, 0.8)) for _ in range(m)))
        for p in range(n)
    }
    state = stats.update(stats.Stats(), observations)

    def step_s(b: int) -> float:  # simulated profile: the roofline decode step, 14B on one H20
        return costmodel.decode_step_time(
            costmodel.H20, costmodel.QWEN3_14B, batch=b, context_tokens=b * 2048
        )

    ptl = budget.fit_ptl([(float(b), step_s(b)) for b in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)])
    ids = [str(p) for p in range(n)]

    def step() -> tuple[list[int], int]:  # what the scheduler and the simulator call once per step
        return plan.pools(state, ids, ptl, m=m, m_up=m_up, lam=0.04, replicas=16)

    results["plan a step (stats + budget + allocate)"] = benchcli.timed_ms(step, cfg.repeats)
    lengths = [round(rng.lognormvariate(7.0, 0.8)) for _ in range(m_up)]
    truncated = [x > 8192 for x in lengths]
    results[f"select_dual_end, one pool of {m_up}"] = benchcli.timed_ms(
        lambda: darts.select_dual_end(lengths, truncated, m, m - 1), cfg.repeats * 10
    )
    results[f"select + advantages, one pool of {m_up}"] = benchcli.timed_ms(
        lambda: selection.group_advantages(
            [float(x % 2) for x in lengths], selection.select(lengths, truncated, m, m - 1, m_up=m_up)
        ),
        cfg.repeats * 10,
    )
    print(f"DARTS policy cost, {n} prompts, M {m}, M_up {m_up} (target: allocation under {TARGET_MS} ms)")
    for name, (median, best) in results.items():
        print(f"  {name:45s} median {median:8.3f} ms   min {best:8.3f} ms")
    if cfg.out:
        out = pathlib.Path(cfg.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(json.dumps(dataclasses.asdict(cfg), indent=1))
        (out / "results.json").write_text(
            json.dumps({k: {"median_ms": v[0], "min_ms": v[1]} for k, v in results.items()}, indent=1)
        )


if __name__ == "__main__":
    main()
