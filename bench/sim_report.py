"""Regenerate ``bench/reports/rollart.md``: RollArt's results beside our simulated reproductions.

Each section runs scenarios from ``bench/scenarios/`` through ``treadle.sim`` (the same policy code
as the live services), prints the paper's number next to ours, and says by how much ours differs.
The explanations of the differences are written against what the runs report (busy shares, the
split of the step time), which the section prints too. Everything here is simulated.

    ~/.cache/treadle/venv/bin/python bench/sim_report.py [--out bench/reports/rollart.md]
"""

from __future__ import annotations

import copy
import dataclasses
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import benchcli
import yaml

from treadle.sim import kinds, metrics
from treadle.sim.kinds import rollart

SCENARIOS = Path(__file__).parent / "scenarios"


@dataclasses.dataclass(frozen=True)
class Config:
    out: str = dataclasses.field(
        default="bench/reports/rollart.md", metadata={"help": "markdown file to write"}
    )
    results: str = dataclasses.field(
        default="out/sim/rollart-report", metadata={"help": "directory for config.json and results.json"}
    )
    seed_offset: int = dataclasses.field(default=0, metadata={"help": "added to every scenario's seed"})


@dataclasses.dataclass
class Row:
    claim: str
    paper: str
    ours: str
    lo: float | None = None
    hi: float | None = None
    value: float | None = None

    def diff(self) -> str:
        if self.value is None or self.lo is None or self.hi is None:
            return "-"
        if self.lo <= self.value <= self.hi:
            return "within the paper's range"
        edge = self.hi if self.value > self.hi else self.lo
        pct = (self.value / edge - 1) * 100
        if self.lo == self.hi:
            return f"{pct:+.0f}% vs the paper"
        return f"{pct:+.0f}% vs the paper's {'upper' if edge == self.hi else 'lower'} end"


@dataclasses.dataclass
class Section:
    title: str
    source: str
    rows: list[Row]
    detail: str
    notes: str
    runs: list[dict[str, Any]] = dataclasses.field(default_factory=list)


def _raw(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((SCENARIOS / name).read_text())
    return loaded


def _run(raw: dict[str, Any], run: str, cfg: Config) -> metrics.Result:
    """One run of the scenario, through the ``rollart`` kind as ``treadle simulate`` runs it."""
    seed = int(raw["simulation"].get("seed", 0)) + cfg.seed_offset
    (result,) = rollart.parse(raw).run(kinds.Options(runs=(run,), seed=seed)).results
    return result


def _busy(r: metrics.Result) -> str:
    return ", ".join(f"{p.name} {p.busy_share:.0%}" for p in r.pools)


def headline(cfg: Config) -> Section:
    raw = _raw("rollart-eval-8b.yaml")
    names = ["sync-plus", "one-off", "areal", "rollart"]
    res = {n: _run(raw, n, cfg) for n in names}
    step = {n: r.step_time_s for n, r in res.items()}
    rows = [
        Row(
            "RollArt over Sync+ (step time)",
            "2.05x",
            f"{step['sync-plus'] / step['rollart']:.2f}x",
            2.05,
            2.05,
            step["sync-plus"] / step["rollart"],
        ),
        Row(
            "RollArt over One-off",
            "1.35x",
            f"{step['one-off'] / step['rollart']:.2f}x",
            1.35,
            1.35,
            step["one-off"] / step["rollart"],
        ),
        Row(
            "RollArt over AReaL (alpha 1)",
            "1.31x",
            f"{step['areal'] / step['rollart']:.2f}x",
            1.31,
            1.31,
            step["areal"] / step["rollart"],
        ),
        Row(
            "One-off over Sync+ (Fig. 10b ladder)",
            "1.31-1.47x",
            f"{step['sync-plus'] / step['one-off']:.2f}x",
            1.31,
            1.47,
            step["sync-plus"] / step["one-off"],
        ),
        Row(
            "AReaL over One-off (Fig. 10b ladder)",
            "1.03-1.06x",
            f"{step['one-off'] / step['areal']:.2f}x",
            1.03,
            1.06,
            step["one-off"] / step["areal"],
        ),
        Row(
            "RollArt over AReaL (Fig. 10b ladder)",
            "1.22-1.36x",
            f"{step['areal'] / step['rollart']:.2f}x",
            1.22,
            1.36,
            step["areal"] / step["rollart"],
        ),
    ]
    detail = "\n".join(
        f"- `{n}`: step {r.step_time_s:.1f} s = wait {r.split()['wait']:.1f} "
        f"+ update {r.split()['update']:.1f} "
        f"+ train {r.split()['train']:.1f}; busy {_busy(r)}; mean staleness {r.mean_staleness:.2f}; "
        f"aborted {r.aborted_stale + r.aborted_redundant}, evicted {r.evicted}; total/LB {r.lb_ratio:.2f}"
        for n, r in res.items()
    )
    notes = (
        "The paper's 2.05/1.35/1.31x are time-to-score on Qwen3-32B (Fig. 10a, worded as step time); we "
        "compare steady-state step time on the 8B mix, the closest thing a simulator without a learning "
        "curve can measure. Where the async systems' step equals their training time (wait near 0), the "
        "trainer is the bottleneck and rollout speed-ups no longer show: our training cost is one factor "
        "calibrated to Fig. 3 (`treadle.sim.cost.TRAIN_MFU`), so the async-vs-async ratios are bounded "
        "by it. "
        "Our AReaL gains more over One-off than the paper's 1.03-1.06x because One-off waits for every "
        "trajectory of its batch (the long tail) each iteration, while AReaL's admission lets the tail run "
        "into the next iteration; the paper's AReaL re-implementation may admit more conservatively."
    )
    return Section(
        "Headline: RollArt vs Sync+ / One-off / AReaL (§7.2, Fig. 10)",
        "rollart-eval-8b.yaml",
        rows,
        detail,
        notes,
        [r.summary() for r in res.values()],
    )


def affinity(cfg: Config) -> Section:
    raw = _raw("rollart-r1-affinity.yaml")
    names = ["rollart", "rollart-h800-only", "rollart-h20-only"]
    res = {n: _run(raw, n, cfg) for n in names}
    mixed = res["rollart"].step_time_s
    over_h800 = res["rollart-h800-only"].step_time_s / mixed
    over_h20 = res["rollart-h20-only"].step_time_s / mixed
    rows = [
        Row("mixed 64 H800 + 24 H20 over 72 H800", "1.12-1.37x", f"{over_h800:.2f}x", 1.12, 1.37, over_h800),
        Row("mixed over 208 H20", "1.30-1.68x", f"{over_h20:.2f}x", 1.30, 1.68, over_h20),
        Row("H20-only is the slowest", "yes", "yes" if over_h20 >= over_h800 else "no"),
    ]
    detail = "\n".join(
        f"- `{n}`: step {r.step_time_s:.1f} s "
        f"(wait {r.split()['wait']:.1f}, train {r.split()['train']:.1f}); "
        f"busy {_busy(r)}; cost {r.cost_h20_hours:.1f} H20-GPU-h"
        for n, r in res.items()
    )
    notes = (
        "Affinity comes from the same `treadle.policy.affinity` the placement service uses: FrozenLake is "
        "declared prefill-heavy, the GEM tasks decode-heavy, WebShop `auto` (the cost model sends it to "
        "H800). The paper's range spans 8B-32B; ours is the 8B point. Where ours is lower, the step is "
        "partly training-bound (train is the same 32 H800 in all three), which caps what faster rollout "
        "can show."
    )
    return Section(
        "Hardware affinity at equal cost (R1, Fig. 11a)",
        "rollart-r1-affinity.yaml",
        rows,
        detail,
        notes,
        [r.summary() for r in res.values()],
    )


def fig4(cfg: Config) -> Section:
    raw = _raw("rollart-fig4.yaml")
    batches = [16, 32, 64, 128, 256]
    ratios: dict[str, list[float]] = {"frozenlake": [], "gem-math": []}
    lines = []
    for task in ratios:
        for bs in batches:
            times = {}
            for run in ("sync-plus", "h20-side"):
                r2 = copy.deepcopy(raw)
                r2["job"]["spec"]["tasks"] = [t for t in r2["job"]["spec"]["tasks"] if t["name"] == task]
                r2["job"]["spec"]["rollout"]["batchSize"] = bs
                result = _run(r2, run, cfg)
                times[run] = sum(s.wait_s for s in result.steps) / len(result.steps)
            h800, h20 = times["sync-plus"], times["h20-side"]
            ratio = h800 / h20 if task == "frozenlake" else h20 / h800
            ratios[task].append(ratio)
            lines.append(f"| {task} | {bs} | {h800:.1f} | {h20:.1f} | {ratio:.2f} |")
    fl, gm = ratios["frozenlake"], ratios["gem-math"]
    rows = [
        Row(
            "FrozenLake: 2xH800 time / 6xH20 time, best batch",
            "0.53x (as low as)",
            f"{min(fl):.2f}x",
            0.53,
            0.53,
            min(fl),
        ),
        Row("FrozenLake: over batch sizes", "-", f"{min(fl):.2f}-{max(fl):.2f}x"),
        Row(
            "GEM-Math: 6xH20 time / 2xH800 time, best batch", "0.49x", f"{min(gm):.2f}x", 0.49, 0.49, min(gm)
        ),
        Row("GEM-Math: worst batch", "0.79x", f"{max(gm):.2f}x", 0.79, 0.79, max(gm)),
    ]
    detail = (
        "| task | batch | 2xH800 rollout s | 6xH20 rollout s | ratio |\n|---|---|---|---|---|\n"
        + "\n".join(lines)
    )
    notes = (
        "The phase-level cost model is calibrated to these two figures (`treadle.policy.costmodel`: MFU "
        "ratio from 0.53x, equal MBU spanning 0.49-0.79x); this end-to-end check adds queueing, tool calls "
        "and long tails, so single batches scatter around the calibrated value. GEM-Math's best is higher "
        "than the phase model's 0.49x because each batch's tail runs with few sequences per GPU, where "
        "decode is bound by reading the weights and H20's bandwidth edge per GPU is small (about 0.84x). "
        "FrozenLake's context is "
        "re-prefilled every turn (Qwen3's template drops earlier reasoning, so the prefix cache misses); "
        "with a perfect prefix cache the cost model calls it decode-heavy "
        "(tests/unit/policy/test_affinity.py)."
    )
    return Section("Cost-equivalent hardware ratios (§3, Fig. 4)", "rollart-fig4.yaml", rows, detail, notes)


def serverless(cfg: Config) -> Section:
    raw = _raw("rollart-r3-reward.yaml")
    res = {n: _run(raw, n, cfg) for n in ("local-reward", "sync-plus")}
    local, remote = (res[n].split()["wait"] for n in ("local-reward", "sync-plus"))
    rows = [
        Row("rollout time, dedicated reward GPUs", "158 s", f"{local:.0f} s"),
        Row("rollout time, serverless reward", "77 s", f"{remote:.0f} s"),
        Row("speed-up", "2.05x", f"{local / remote:.2f}x", 2.05, 2.05, local / remote),
        Row("dedicated reward GPU utilisation", "6%", f"{res['local-reward'].reward_busy_share:.0%}"),
    ]
    detail = "\n".join(
        f"- `{n}`: rollout (wait) {r.split()['wait']:.1f} s; busy {_busy(r)}; total/LB {r.lb_ratio:.2f}"
        for n, r in res.items()
    )
    notes = (
        "Freeing the 4 reward GPUs doubles the rollout GPUs (4 -> 8). That halves rollout time only when "
        "rollout is throughput-bound; ours is partly bound by the longest trajectories (the busy shares "
        "above stay well below 100%), so it gains less than the paper's 2.05x. The paper's three concurrent "
        "jobs are one job of batch 252 here, and the serverless judge's cold start is our 5 s (the paper "
        "gives none). The paper's 88% utilisation with serverless reward is of the serverless platform's "
        "GPUs, which we do not model as a pool."
    )
    return Section(
        "Serverless vs dedicated reward (R3, Fig. 12)",
        "rollart-r3-reward.yaml",
        rows,
        detail,
        notes,
        [r.summary() for r in res.values()],
    )


def redundancy(cfg: Config) -> Section:
    raw = _raw("rollart-redundancy.yaml")
    lines = []
    base = None
    best = 0.0
    for frac in (0.0, 0.125, 0.25, 0.5):
        r2 = copy.deepcopy(raw)
        r2["job"]["spec"]["tasks"][0]["redundancy"] = frac
        result = _run(r2, "redundant", cfg)
        wait = result.split()["wait"]
        base = base or wait
        best = max(best, base / wait)
        lines.append(f"| {frac:.3f} | {wait:.1f} | {base / wait:.2f}x | {result.aborted_redundant} |")
    rows = [
        Row(
            "rollout speed-up from redundant env rollouts (max)",
            "up to 1.62x",
            f"{best:.2f}x",
            1.0,
            1.62,
            best,
        )
    ]
    detail = "| redundancy | rollout s | speed-up | aborted siblings |\n|---|---|---|---|\n" + "\n".join(
        lines
    )
    notes = (
        "The paper sweeps env groups and group size (the grid is lost); we sweep the extra members per "
        "group of 8 (`tasks[].redundancy`). The gain is the tail cut off: with our lognormal response "
        "lengths (cv 1.2) and RollArt's rare long resets, the slowest members of each group are dropped. "
        "A heavier tail than the paper's workload gives a larger speed-up; the bias this introduces "
        "(shorter responses over-represented) is not modelled."
    )
    return Section(
        "Redundant environment rollouts (§6.3, Fig. 14b)", "rollart-redundancy.yaml", rows, detail, notes
    )


def env_interaction(cfg: Config) -> Section:
    raw = _raw("rollart-r2-env.yaml")
    lines = []
    gains = []
    for sigma in (1.0, 5.0, 10.0):
        r2 = copy.deepcopy(raw)
        r2["simulation"]["workloads"]["agentic"]["tool_latency_s"]["cv"] = sigma / 10.0
        waits = {n: _run(r2, n, cfg).split()["wait"] for n in ("batch-env", "sync-plus")}
        gain = waits["batch-env"] / waits["sync-plus"]
        gains.append(gain)
        lines.append(f"| {sigma:.0f} | {waits['batch-env']:.1f} | {waits['sync-plus']:.1f} | {gain:.2f}x |")
    rows = [
        Row(
            "trajectory-level over batch env, sigma = 1 s", "1.23x", f"{gains[0]:.2f}x", 1.23, 1.23, gains[0]
        ),
        Row(
            "trajectory-level over batch env, sigma = 10 s",
            "2.27x",
            f"{gains[-1]:.2f}x",
            2.27,
            2.27,
            gains[-1],
        ),
        Row("gain grows with sigma", "yes", "yes" if gains == sorted(gains) else "no"),
    ]
    detail = (
        "| sigma s | batch env rollout s | trajectory-level rollout s | gain |\n|---|---|---|---|\n"
        + "\n".join(lines)
    )
    notes = (
        "Per-turn barriers make every turn as slow as its slowest environment step and slowest generation; "
        "the gain grows with the spread of env latency as in the paper. Our task shape (6 turns, 300-token "
        "responses) is ours, so the size of the gain at each sigma depends on it; a normal latency is "
        "truncated at 0 s."
    )
    return Section(
        "Trajectory-level vs batch env interaction (R2, Fig. 11b)", "rollart-r2-env.yaml", rows, detail, notes
    )


def render(sections: Sequence[Section], seconds: float) -> str:
    out = [
        "# RollArt reproductions (simulated)",
        "",
        "Generated by `bench/sim_report.py` from the scenarios in `bench/scenarios/`; every figure in the "
        '"ours" column is **simulated** by `treadle.sim`, which drives the same `treadle.policy` functions '
        "as the live services. Paper numbers are from the RollArt digest "
        "(`shared/papers/digests/rollart.md`). "
        f"Regenerating took {seconds:.0f} s.",
        "",
    ]
    for s in sections:
        out += [
            f"## {s.title}",
            "",
            f"Scenario: `bench/scenarios/{s.source}`",
            "",
            "| claim | paper | ours (simulated) | difference |",
            "|---|---|---|---|",
        ]
        out += [f"| {r.claim} | {r.paper} | {r.ours} | {r.diff()} |" for r in s.rows]
        out += ["", s.detail, "", f"Why ours differs: {s.notes}", ""]
    return "\n".join(out)


def main() -> None:
    cfg = benchcli.parse(Config, __doc__)
    started = time.perf_counter()
    builders: list[Callable[[Config], Section]] = [
        headline,
        affinity,
        fig4,
        env_interaction,
        serverless,
        redundancy,
    ]
    sections = []
    for build in builders:
        section = build(cfg)
        print(f"{section.title}")
        for row in section.rows:
            print(f"  {row.claim:60s} paper {row.paper:18s} ours {row.ours:12s} {row.diff()}")
        sections.append(section)
    Path(cfg.out).parent.mkdir(parents=True, exist_ok=True)
    Path(cfg.out).write_text(render(sections, time.perf_counter() - started))
    results = Path(cfg.results)
    results.mkdir(parents=True, exist_ok=True)
    (results / "config.json").write_text(json.dumps(dataclasses.asdict(cfg), indent=2) + "\n")
    (results / "results.json").write_text(
        json.dumps(
            [
                {"title": s.title, "runs": s.runs, "rows": [dataclasses.asdict(r) for r in s.rows]}
                for s in sections
            ],
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {cfg.out} and {results}/results.json (simulated)")


if __name__ == "__main__":
    main()
