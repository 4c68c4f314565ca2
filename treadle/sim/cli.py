"""``treadle simulate SCENARIO``: run any scenario file, print a table, write results and plots.

Registered in ``treadle.cli.COMMAND_MODULES``. ``treadle.sim.simulate`` picks the simulator by the
file's ``kind``. The output directory gets ``config.json`` (the scenario and the options as run),
``results.json`` and, unless ``--no-plots``, the kind's plots (``rollart``: ``step_times.png`` and
``in_flight.png``; matplotlib, extra ``sim``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from treadle import errors
from treadle.sim import kinds, simulate


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "simulate",
        help="simulate a scenario (bench/scenarios/**/*.yaml: RollArt, Heddle, FlexMARL, DARTS) "
        "and compare systems",
        description="Discrete-event simulation over the same treadle.policy code as the live services. "
        "Every figure it prints is simulated.",
    )
    parser.add_argument("scenario", help="scenario YAML file (its kind: picks the simulator)")
    parser.add_argument(
        "--runs", default="", help="comma-separated systems/variants (default: the scenario's)"
    )
    parser.add_argument(
        "--steps", type=int, default=None, help="training steps per run (default: the scenario's)"
    )
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: the scenario's)")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="the smallest run of every part of the scenario (for tests; never for reported figures)",
    )
    parser.add_argument("--out", default="", help="output directory (default: out/sim/<scenario>)")
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    options = kinds.Options(
        runs=tuple(r for r in args.runs.split(",") if r), steps=args.steps, seed=args.seed, quick=args.quick
    )
    try:
        plan = simulate.load(args.scenario)
        outcome = plan.run(options)
    except errors.SpecError as exc:
        print(f"error: {exc}")
        return 2
    print(outcome.table())
    out = Path(args.out or Path("out") / "sim" / plan.name)
    written = write(out, plan, outcome, options, plots=not args.no_plots)
    print(f"\nwrote {out}/" + ", ".join(written))
    return 0


def write(
    out: Path, plan: kinds.Plan, outcome: kinds.Outcome, options: kinds.Options, *, plots: bool
) -> list[str]:
    """``config.json`` and ``results.json`` (and the plots) under ``out``; the file names written."""
    out.mkdir(parents=True, exist_ok=True)
    as_run: dict[str, Any] = {"runs": list(options.runs or plan.runs)}
    as_run |= {k: v for k, v in (("steps", options.steps), ("seed", options.seed)) if v is not None}
    if options.quick:
        as_run["quick"] = True
    config = {
        "label": "simulated",
        "scenario": plan.name,
        "description": plan.description,
        "options": as_run,
        **plan.body,
    }
    (out / "config.json").write_text(json.dumps(config, indent=2, default=str) + "\n")
    (out / "results.json").write_text(json.dumps(outcome.summary(), indent=2) + "\n")
    return ["config.json", "results.json", *(outcome.plot(out) if plots else [])]
