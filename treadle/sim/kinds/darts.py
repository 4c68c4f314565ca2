"""The ``darts`` scenario kind: DARTS against verl and Tail Batching over a learning length policy.

The body is ``simulation``: ``seeds``, ``steps``, ``accelerator``, the run settings shared by every
setup (``SETTINGS``: batch, group, ``m_up``, ``long_end``, ``lambda``, ``ema_decay``, lengths,
training and learning rates; see ``treadle.sim.darts.Config``), ``workload`` (the prompts' length
policies and reward model, ``treadle.sim.darts.Workload``) and ``setups``: name -> ``model``,
``gpus``, ``tp``, ``runs`` (systems of ``treadle.sim.darts.SYSTEMS``, ``verl`` first: speedups are
over it) and optionally any setting to override. Every cell is the mean over the seeds.
``--quick`` runs the first seed for two steps; ``--steps``/``--seed`` replace the scenario's.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping
from typing import Any

from treadle import errors
from treadle.policy import costmodel
from treadle.sim import darts, kinds

NAME = "darts"
INTS = ("prompts", "batch", "group", "m_up", "long_end", "max_tokens", "context", "chunk")
FLOATS = (
    "rollout_share", "lambda", "ema_decay", "train_mfu", "sync_s", "oversample", "lr_mu", "lr_sigma",
)  # fmt: skip
SETTINGS = INTS + FLOATS
WORKLOAD = tuple(f.name for f in dataclasses.fields(darts.Workload))
QUICK_STEPS = 2
METRICS = ("speedup", "throughput", "rollout_s", "train_s", "mean_length", "accuracy", "budget", "saturated")


def _number(raw: Mapping[str, Any], key: str, field: str, kind: type) -> Any:
    try:
        return kind(raw[key])
    except (TypeError, ValueError):
        raise errors.SpecError(f"must be a number, got {raw[key]!r}", field=f"{field}.{key}") from None


def parse(raw: Any) -> Plan:
    raw = kinds.envelope(raw, NAME)
    sim = kinds.section(raw, "simulation", ("seeds", "steps", "accelerator", "workload", "setups", *SETTINGS))
    kinds.known(sim["accelerator"], costmodel.ACCELERATORS, "simulation.accelerator")
    workload = kinds.section({"simulation.workload": sim["workload"]}, "simulation.workload", WORKLOAD)
    kind = {k: int if k == "prompt_tokens" else float for k in WORKLOAD}
    load = darts.Workload(**{k: _number(workload, k, "simulation.workload", kind[k]) for k in WORKLOAD})
    setups = sim["setups"]
    if not isinstance(setups, Mapping) or not setups:
        raise errors.SpecError("name at least one setup", field="simulation.setups")
    seeds = sim["seeds"]
    if not isinstance(seeds, list) or not seeds:
        raise errors.SpecError("name at least one seed", field="simulation.seeds")
    plan = Plan(
        name=str(raw["name"]),
        description=str(raw.get("description", "")),
        simulation=sim,
        workload=load,
        seeds=tuple(_number({"s": s}, "s", "simulation.seeds", int) for s in seeds),
        steps=_number(sim, "steps", "simulation", int),
    )
    for name in setups:
        plan.configs(str(name), plan.seeds[0], plan.steps)  # validates every field now, naming it
    return plan


@dataclasses.dataclass(frozen=True)
class Plan:
    name: str
    description: str
    simulation: Mapping[str, Any]
    workload: darts.Workload
    seeds: tuple[int, ...]
    steps: int

    @property
    def runs(self) -> tuple[str, ...]:
        return tuple(darts.SYSTEMS)

    @property
    def body(self) -> Mapping[str, Any]:
        return {"simulation": self.simulation}

    def configs(self, setup: str, seed: int, steps: int) -> tuple[darts.Config, tuple[darts.System, ...]]:
        """The run configuration of ``setup`` and its systems; ``SpecError`` names the bad field."""
        field = f"simulation.setups.{setup}"
        raw = kinds.section(
            {field: self.simulation["setups"].get(setup)}, field, ("model", "gpus", "tp", "runs")
        )
        model = costmodel.model(kinds.known(raw["model"], costmodel.MODELS, f"{field}.model"))
        merged = {**{k: self.simulation[k] for k in SETTINGS}, **{k: raw[k] for k in SETTINGS if k in raw}}
        values = {k: _number(merged, k, field, int if k in INTS else float) for k in SETTINGS}
        values["lam"] = values.pop("lambda")
        runs = raw["runs"]
        if not isinstance(runs, list) or not runs or runs[0] != "verl":
            raise errors.SpecError(
                "must list systems, verl first (speedups are over it)", field=f"{field}.runs"
            )
        systems = tuple(_system(str(r), f"{field}.runs") for r in runs)
        try:
            cfg = darts.Config(
                model=model,
                accelerator=costmodel.accelerator(str(self.simulation["accelerator"])),
                gpus=_number(raw, "gpus", field, int),
                tp=_number(raw, "tp", field, int),
                workload=self.workload,
                steps=steps,
                seed=seed,
                **values,
            )
        except errors.SpecError as exc:
            message = str(exc).removeprefix(f"{exc.field}: ")
            raise errors.SpecError(message, field=f"{field}.{exc.field}", value=exc.value) from None
        return cfg, systems

    def run(self, options: kinds.Options) -> kinds.Cells:
        seeds = (options.seed,) if options.seed is not None else self.seeds[: 1 if options.quick else None]
        steps = options.steps if options.steps is not None else QUICK_STEPS if options.quick else self.steps
        wanted = tuple(_system(r, "--runs").name for r in options.runs)
        cells: dict[str, dict[str, dict[str, float]]] = {}
        for setup in self.simulation["setups"]:
            results: dict[str, list[darts.Result]] = {}
            for seed in seeds:
                cfg, systems = self.configs(str(setup), seed, steps)
                for system in systems:
                    if system.name == "verl" or not wanted or system.name in wanted:
                        results.setdefault(system.name, []).append(darts.run(cfg, system))
            cells[str(setup)] = _means(results)
        return kinds.Cells(self.name, cells, METRICS, ("setup", "system"), "means over the seeds and steps")


def _system(name: str, field: str) -> darts.System:
    try:
        return darts.SYSTEMS[name]
    except KeyError:
        raise errors.SpecError(
            f"unknown system {name!r}; known: {list(darts.SYSTEMS)}", field=field
        ) from None


def _means(results: Mapping[str, list[darts.Result]]) -> dict[str, dict[str, float]]:
    """Per system, the mean over seeds; ``speedup`` is throughput over verl's of the same seed."""
    base = results["verl"]
    out = {}
    for name, rs in results.items():
        steps = [s for r in rs for s in r.steps]
        out[name] = {
            "speedup": statistics.fmean(r.throughput / b.throughput for r, b in zip(rs, base, strict=True)),
            "throughput": statistics.fmean(r.throughput for r in rs),
            "rollout_s": statistics.fmean(s.rollout_s for s in steps),
            "train_s": statistics.fmean(s.train_s for s in steps),
            "mean_length": statistics.fmean(s.mean_length for s in steps),
            "accuracy": statistics.fmean(s.accuracy for s in steps),
            "budget": statistics.fmean(s.budget for s in steps),
            "saturated": statistics.fmean(s.saturated for s in steps),
        }
    return out
