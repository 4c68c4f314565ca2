"""The ``tangram`` scenario kind: ARL-Tangram against its baselines (``treadle.sim.tangram``).

The body is ``simulation``: ``workload`` (``coding`` or ``mopd``), ``seeds``, ``systems`` (the
workload's systems to run, in report order), ``base`` (the fields of ``tangram.Coding`` or
``tangram.Mopd``; distributions as ``workloads.parse_dist`` reads them), optional ``sweeps`` (field
-> values, each value one cell over ``base``: Fig. 8's batch and capacity sweeps) and ``quick``
(fields that replace ``base`` for ``--quick``). Every cell is the mean over the seeds of each
system. ``--quick`` runs the first seed, ``base`` with ``quick`` applied and the first value of each
sweep; ``--seed`` runs one seed; ``--steps`` is refused (a run is one rollout step).
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from treadle import errors
from treadle.sim import kinds, tangram, workloads

NAME = "tangram"
WORKLOADS: Mapping[str, tuple[type[tangram.Coding] | type[tangram.Mopd], tuple[str, ...]]] = {
    "coding": (tangram.Coding, tangram.CODING_SYSTEMS),
    "mopd": (tangram.Mopd, tangram.MOPD_SYSTEMS),
}
BASELINE = {"coding": "k8s", "mopd": "static"}
METRICS = ("act_s", "act_per_traj_s", "makespan_s", "busy_fraction", "decision_ms")


def parse(raw: Any) -> Plan:
    raw = kinds.envelope(raw, NAME)
    sim = kinds.section(raw, "simulation", ("workload", "seeds", "systems", "base"))
    workload = kinds.known(sim["workload"], WORKLOADS, "simulation.workload")
    cls, known_systems = WORKLOADS[workload]
    try:
        seeds = tuple(int(s) for s in sim["seeds"])
    except (TypeError, ValueError) as exc:
        raise errors.SpecError(f"bad seed: {exc}", field="simulation.seeds") from None
    if not seeds:
        raise errors.SpecError("name at least one seed", field="simulation.seeds")
    systems = tuple(str(s) for s in sim["systems"])
    for s in systems:
        _system(s, known_systems, "simulation.systems")
    base = _fields(cls, sim["base"], "simulation.base")
    quick = _fields(cls, sim.get("quick", {}), "simulation.quick")
    sweeps = sim.get("sweeps", {})
    if not isinstance(sweeps, Mapping):
        raise errors.SpecError("must be a mapping of field -> values", field="simulation.sweeps")
    cells: dict[str, dict[str, Any]] = {}
    for key, values in sweeps.items():
        if not isinstance(values, list) or not values:
            raise errors.SpecError("must be a non-empty list", field=f"simulation.sweeps.{key}")
        for v in values:
            cells[f"{key}={v}"] = _fields(cls, {key: v}, f"simulation.sweeps.{key}")
    config = _config(cls, base, "simulation.base")
    return Plan(
        name=str(raw["name"]),
        description=str(raw.get("description", "")),
        simulation=sim,
        workload=workload,
        config=config,
        quick=quick,
        cells=cells,
        seeds=seeds,
        systems=systems,
    )


def _system(name: str, known: Sequence[str], field: str) -> str:
    fixed = tangram.FIXED_DOP
    if name in known or (name.startswith(fixed) and name[len(fixed) :].isdigit() and f"{fixed}4" in known):
        return name
    raise errors.SpecError(f"unknown system {name!r}; known: {list(known)}", field=field, value=name)


def _fields(cls: type, raw: Any, field: str) -> dict[str, Any]:
    """``raw`` as constructor values of ``cls`` (``Coding``/``Mopd``); errors name the field."""
    if not isinstance(raw, Mapping):
        raise errors.SpecError("must be a mapping", field=field)
    types = {f.name: str(f.type) for f in dataclasses.fields(cls)}
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in types:
            raise errors.SpecError(f"unknown field; known: {sorted(types)}", field=f"{field}.{key}")
        kind = types[key]
        try:
            if kind == "workloads.Dist":
                out[key] = workloads.parse_dist(value, field=f"{field}.{key}")
            elif kind == "bool":
                if not isinstance(value, bool):
                    raise TypeError("must be true or false")
                out[key] = value
            elif kind == "int | None":
                out[key] = None if value is None else int(value)
            else:
                out[key] = int(value) if kind == "int" else float(value)
        except (TypeError, ValueError) as exc:
            raise errors.SpecError(f"bad value: {exc}", field=f"{field}.{key}", value=value) from None
    return out


def _config(cls: type, values: Mapping[str, Any], field: str) -> tangram.Coding | tangram.Mopd:
    missing = [
        f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING and f.name not in values
    ]
    if missing:
        raise errors.SpecError("is required", field=f"{field}.{missing[0]}")
    config: tangram.Coding | tangram.Mopd = cls(**values)
    return config


@dataclasses.dataclass(frozen=True)
class Plan:
    name: str
    description: str
    simulation: Mapping[str, Any]
    workload: str
    config: tangram.Coding | tangram.Mopd
    quick: Mapping[str, Any]
    cells: Mapping[str, Mapping[str, Any]]
    """Sweep cell name (``batch=256``) -> the fields it changes."""
    seeds: tuple[int, ...]
    systems: tuple[str, ...]

    @property
    def runs(self) -> tuple[str, ...]:
        return self.systems

    @property
    def body(self) -> Mapping[str, Any]:
        return {"simulation": self.simulation}

    def run(self, options: kinds.Options) -> Report:
        if options.steps is not None:
            raise errors.SpecError("a tangram run is one rollout step", field="--steps", value=options.steps)
        known = WORKLOADS[self.workload][1]
        systems = [_system(s, known, "--runs") for s in options.runs or self.systems]
        seeds = (options.seed,) if options.seed is not None else self.seeds[: 1 if options.quick else None]
        base = dataclasses.replace(self.config, **self.quick) if options.quick else self.config
        cells: dict[str, Mapping[str, Any]] = {"base": {}}
        seen: set[str] = set()
        for name, change in self.cells.items():
            key = name.split("=")[0]
            if options.quick and key in seen:
                continue
            seen.add(key)
            cells[name] = change
        out: dict[str, dict[str, dict[str, Any]]] = {}
        for name, change in cells.items():
            config = dataclasses.replace(base, **change)
            out[name] = {s: self._mean(config, s, seeds) for s in systems}
        return Report(self.name, self.workload, out)

    def _mean(
        self, config: tangram.Coding | tangram.Mopd, system: str, seeds: Sequence[int]
    ) -> dict[str, Any]:
        results = []
        for seed in seeds:
            c = dataclasses.replace(config, seed=seed)
            results.append(
                tangram.run_coding(c, system)
                if isinstance(c, tangram.Coding)
                else tangram.run_mopd(c, system)
            )
        out: dict[str, Any] = {m: statistics.fmean(getattr(r, m) for r in results) for m in METRICS}
        out["stage_s"] = {k: statistics.fmean(r.stage_s[k] for r in results) for k in results[0].stage_s}
        out["breakdown"] = {
            kind: {m: statistics.fmean(r.breakdown[kind][m] for r in results) for m in parts}
            for kind, parts in results[0].breakdown.items()
        }
        out["timeouts"] = statistics.fmean(r.timeouts for r in results)
        out["restores"] = statistics.fmean(r.restores for r in results)
        return out


@dataclasses.dataclass(frozen=True)
class Report:
    scenario: str
    workload: str
    cells: Mapping[str, Mapping[str, Mapping[str, Any]]]
    """Cell -> system -> metric -> mean over the seeds."""

    def table(self) -> str:
        baseline = BASELINE[self.workload]
        rows = []
        for cell, by_system in self.cells.items():
            ref = by_system.get(baseline, {}).get("act_per_traj_s")
            for system, m in by_system.items():
                stages = " ".join(f"{k}={v:,.2f}" for k, v in m["stage_s"].items())
                gain = f"{ref / m['act_per_traj_s']:.2f}x" if ref else "-"
                rows.append(
                    [cell, system, *(f"{m[k]:,.3f}" for k in METRICS), stages, gain, f"{m['timeouts']:.0f}"]
                )
        header = (
            f"SIMULATED -- scenario {self.scenario} ({self.workload}): means over the seeds; seconds, "
            f"decision_ms measured; gain = {baseline}'s ACT per trajectory / this system's"
        )
        cols = ["cell", "system", *METRICS, "ACT per trajectory by kind", "gain", "timeouts"]
        return kinds.table(header, cols, rows)

    def summary(self) -> dict[str, Any]:
        return {"label": "simulated", "workload": self.workload, "cells": self.cells}

    def plot(self, out: Path) -> list[str]:
        return []
