"""``treadle simulate SCENARIO``: run a scenario's systems, print a table, write results and plots.

Registered in ``treadle.cli.COMMAND_MODULES``; ``bench/sim_*.py`` reuse ``table`` and ``write``.
The output directory gets ``config.json`` (the scenario and the options as run), ``results.json``
and, unless ``--no-plots``, ``step_times.png`` and ``in_flight.png`` (matplotlib, extra ``sim``).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from treadle import errors
from treadle.sim import engine, metrics, scenario


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "simulate",
        help="simulate a rollout scenario (bench/scenarios/*.yaml) and compare systems",
        description="Discrete-event simulation over the same treadle.policy code as the live services. "
        "Every figure it prints is simulated.",
    )
    parser.add_argument("scenario", help="scenario YAML file")
    parser.add_argument(
        "--runs", default="", help="comma-separated systems/variants (default: the scenario's)"
    )
    parser.add_argument(
        "--steps", type=int, default=None, help="training steps per run (default: the scenario's)"
    )
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: the scenario's)")
    parser.add_argument("--out", default="", help="output directory (default: out/sim/<scenario>)")
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    try:
        sc = scenario.load(args.scenario)
        runs = [r for r in args.runs.split(",") if r] or list(sc.runs)
        changes: dict[str, Any] = {}
        if args.steps is not None:
            changes["steps"] = args.steps
        if args.seed is not None:
            changes["seed"] = args.seed
        configs = [sc.config(run, **changes) for run in runs]
        results = [engine.run(cfg) for cfg in configs]
    except errors.SpecError as exc:
        print(f"error: {exc}")
        return 2
    print(table(results))
    out = Path(args.out or Path("out") / "sim" / sc.name)
    write(out, sc, results, options={"runs": runs, **changes}, plots=not args.no_plots)
    print(
        f"\nwrote {out}/config.json, results.json"
        + ("" if args.no_plots else ", step_times.png, in_flight.png")
    )
    return 0


def table(results: Sequence[metrics.Result]) -> str:
    """A plain-text table, one row per run; the first run is the reference for ``speedup``."""
    if not results:
        return "(no runs)"
    first = results[0]
    header = (
        f"SIMULATED -- scenario {first.scenario}, {len(first.steps)} steps; times in seconds per step "
        "(wait = rollout the trainer waited for, incl. sync weight broadcast)"
    )
    cols = [
        "system",
        "step_s",
        "speedup",
        "tok/s",
        "wait",
        "update",
        "train",
        "busy per pool",
        "total/LB",
        "cost H20-h",
        "trained",
        "aborted",
        "evicted",
        "stale",
    ]
    rows = []
    for r in results:
        split = r.split()
        busy = " ".join(f"{p.name}:{p.busy_share:.0%}" for p in r.pools)
        rows.append(
            [
                r.system,
                f"{r.step_time_s:.1f}",
                f"{first.step_time_s / r.step_time_s:.2f}x" if r.step_time_s > 0 else "-",
                f"{r.throughput_tps:,.0f}",
                f"{split['wait']:.1f}",
                f"{split['update']:.1f}",
                f"{split['train']:.1f}",
                busy,
                f"{r.lb_ratio:.2f}",
                f"{r.cost_h20_hours:.1f}",
                str(r.trained),
                str(r.aborted_stale + r.aborted_redundant),
                str(r.evicted),
                f"{r.mean_staleness:.2f}",
            ]
        )
    widths = [max(len(c), *(len(row[i]) for row in rows)) for i, c in enumerate(cols)]
    lines = [header, "  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) for row in rows]
    return "\n".join(lines)


def write(
    out: Path,
    sc: scenario.Scenario,
    results: Sequence[metrics.Result],
    *,
    options: dict[str, Any],
    plots: bool,
) -> None:
    """``config.json`` and ``results.json`` (and the plots) under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    config = {
        "label": "simulated",
        "scenario": sc.name,
        "description": sc.description,
        "options": options,
        "job": sc.raw_job,
        "simulation": sc.simulation,
    }
    (out / "config.json").write_text(json.dumps(config, indent=2, default=str) + "\n")
    (out / "results.json").write_text(json.dumps([r.summary() for r in results], indent=2) + "\n")
    if plots:
        plot(out, results)


def plot(out: Path, results: Sequence[metrics.Result]) -> None:
    """Step time per run (stacked wait/update/train) and in-flight trajectories over time."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only, never a display
        from matplotlib import pyplot
    except ImportError as exc:
        raise errors.SpecError(
            "plots need matplotlib: pip install 'treadle[sim]' (or pass --no-plots)", field="--no-plots"
        ) from exc
    names = [r.system for r in results]
    fig, ax = pyplot.subplots(figsize=(max(6.0, 1.2 * len(results)), 4.0))
    bottom = [0.0] * len(results)
    for part in ("wait", "update", "train"):
        values = [r.split()[part] for r in results]
        ax.bar(names, values, bottom=bottom, label=part)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.set_ylabel("seconds per step (simulated)")
    ax.set_title(f"{results[0].scenario}: step time split (simulated)")
    ax.legend()
    ax.tick_params(axis="x", rotation=30)
    fig.tight_layout()
    fig.savefig(out / "step_times.png", dpi=100)
    pyplot.close(fig)

    fig, ax = pyplot.subplots(figsize=(8.0, 4.0))
    for r in results:
        ax.step(r.timeline.times, r.timeline.values, where="post", label=r.system)
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("trajectories in flight")
    ax.set_title(f"{results[0].scenario}: in-flight trajectories (simulated)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "in_flight.png", dpi=100)
    pyplot.close(fig)
