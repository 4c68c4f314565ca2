"""The ``rollart`` scenario kind: a RolloutJob plus simulation settings, run by ``treadle.sim.engine``.

The body is ``job`` (a RolloutJob, parsed by ``treadle.api``) and ``simulation`` (systems, variants,
hardware, workloads...), validated by ``treadle.sim.scenario``; every run is one ``engine.run``. The
kind is named for RollArt, whose systems (Sync, Sync+, One-off, AReaL, RollArt) it compares, and is
the default for a file with no ``kind`` (the format before kinds existed). ``--quick`` runs one
training step of each run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from treadle import errors
from treadle.sim import engine, kinds, metrics, scenario

NAME = "rollart"


def parse(raw: Any) -> Plan:
    return Plan(scenario.parse(kinds.envelope(raw, NAME)))


@dataclasses.dataclass(frozen=True)
class Plan:
    scenario: scenario.Scenario

    @property
    def name(self) -> str:
        return self.scenario.name

    @property
    def description(self) -> str:
        return self.scenario.description

    @property
    def runs(self) -> tuple[str, ...]:
        return self.scenario.runs

    @property
    def body(self) -> Mapping[str, Any]:
        return {"job": self.scenario.raw_job, "simulation": self.scenario.simulation}

    def run(self, options: kinds.Options) -> Runs:
        """Every run (any system or variant the scenario knows), validated before the first starts."""
        changes: dict[str, Any] = {}
        if options.steps is not None:
            changes["steps"] = options.steps
        elif options.quick:
            changes["steps"] = 1
        if options.seed is not None:
            changes["seed"] = options.seed
        configs = [self.scenario.config(run, **changes) for run in options.runs or self.runs]
        return Runs(tuple(engine.run(cfg) for cfg in configs))


@dataclasses.dataclass(frozen=True)
class Runs:
    results: tuple[metrics.Result, ...]

    def table(self) -> str:
        return _table(self.results)

    def summary(self) -> list[dict[str, object]]:
        return [r.summary() for r in self.results]

    def plot(self, out: Path) -> list[str]:
        return _plot(out, self.results)


def _table(results: Sequence[metrics.Result]) -> str:
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
    return kinds.table(header, cols, rows)


def _plot(out: Path, results: Sequence[metrics.Result]) -> list[str]:
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
    return ["step_times.png", "in_flight.png"]
