"""The ``heddle`` scenario kind: one synchronous rollout step per run, by ``treadle.sim.heddle``.

The body is ``simulation``: the hardware (``accelerator``, ``gpus``), the batch (``per_worker``
trajectories per baseline worker, GRPO ``group_size``, ``max_seqs``), ``models`` (model -> the
baselines' TP), ``ablation_model``, ``domains`` (``heddle.parse_domain``) and an optional
``scale_check: {gpus, domain}`` and ``live_mirror: {domain, max_seqs}``. A plan runs up to five
sections, each ``heddle.run`` on one batch: ``headline`` (verl and Heddle per domain and model),
``oracle`` (Heddle with the noisy-oracle predictor), ``ablation`` (Heddle and every ablation on
``ablation_model``), ``scale_check`` and ``live_mirror`` (``heddle.LIVE_MIRROR``, the configurations
of ``bench/heddle_live.py`` at ``max_seqs`` a worker, standing for its gate's share of a worker).
``--runs`` keeps only the named systems in every section; ``--steps`` does not apply (one step per
run); ``--quick`` keeps the first domain and one GRPO group per worker.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from treadle import errors
from treadle.policy import costmodel
from treadle.sim import heddle, kinds

NAME = "heddle"
REQUIRED = (
    "seed",
    "accelerator",
    "gpus",
    "per_worker",
    "group_size",
    "max_seqs",
    "models",
    "ablation_model",
    "domains",
)
HEADLINE = ("verl", "heddle")
ABLATIONS = {
    "scheduling": ("sched-fcfs", "sched-round-robin", "sched-autellix"),
    "placement": ("place-least-load", "place-cache-aware"),
    "resources": ("fix-1", "fix-8"),
}
SCALE_CHECK = ("verl", "heddle", "fix-8")


def parse(raw: Any) -> Plan:
    raw = kinds.envelope(raw, NAME)
    sim = kinds.section(raw, "simulation", REQUIRED)
    try:
        kinds.known(sim["accelerator"], costmodel.ACCELERATORS, "simulation.accelerator")
        models = {
            kinds.known(m, costmodel.MODELS, f"simulation.models.{m}"): int(tp)
            for m, tp in dict(sim["models"]).items()
        }
        numbers = {k: int(sim[k]) for k in ("seed", "gpus", "per_worker", "group_size", "max_seqs")}
    except (TypeError, ValueError) as exc:
        raise errors.SpecError(f"bad value: {exc}", field="simulation") from None
    if str(sim["ablation_model"]) not in models:
        raise errors.SpecError("must be one of simulation.models", field="simulation.ablation_model")
    if not isinstance(sim["domains"], Mapping) or not sim["domains"]:
        raise errors.SpecError("name at least one domain", field="simulation.domains")
    domains = {
        str(name): heddle.parse_domain(d, name=str(name), field=f"simulation.domains.{name}")
        for name, d in sim["domains"].items()
    }
    scale = sim.get("scale_check")
    if scale is not None and (not isinstance(scale, Mapping) or str(scale.get("domain")) not in domains):
        raise errors.SpecError(
            "needs gpus and a domain of simulation.domains", field="simulation.scale_check"
        )
    mirror = sim.get("live_mirror")
    if mirror is not None and (not isinstance(mirror, Mapping) or str(mirror.get("domain")) not in domains):
        raise errors.SpecError(
            "needs max_seqs and a domain of simulation.domains", field="simulation.live_mirror"
        )
    return Plan(
        name=str(raw["name"]),
        description=str(raw.get("description", "")),
        simulation=sim,
        domains=domains,
        models=models,
        numbers=numbers,
    )


@dataclasses.dataclass(frozen=True)
class Cell:
    """One ``heddle.run``: every system of a section on one batch."""

    section: str
    domain: str
    model: str
    results: tuple[heddle.StepResult, ...]

    def get(self, system: str) -> heddle.StepResult:
        return next(r for r in self.results if r.system == system)


@dataclasses.dataclass(frozen=True)
class Plan:
    name: str
    description: str
    simulation: Mapping[str, Any]
    domains: Mapping[str, heddle.Domain]
    models: Mapping[str, int]
    """Model -> the baselines' homogeneous TP."""
    numbers: Mapping[str, int]

    @property
    def runs(self) -> tuple[str, ...]:
        names = (*HEADLINE, *(n for group in ABLATIONS.values() for n in group))
        mirror = heddle.LIVE_MIRROR if "live_mirror" in self.simulation else ()
        # a fixed TP wider than the pool cannot run (fix-8 on the 2-GPU live mirror)
        fits = (n for n in (*names, *mirror) if _fits(heddle.SYSTEMS[n], self.numbers["gpus"]))
        return tuple(dict.fromkeys(fits))

    @property
    def body(self) -> Mapping[str, Any]:
        return {"simulation": self.simulation}

    def step(self, domain: heddle.Domain, model: str, **changes: Any) -> heddle.StepConfig:
        """The step configuration of ``domain`` on ``model`` (``changes`` replace its fields)."""
        n = self.numbers
        base = heddle.StepConfig(
            domain=domain,
            model=costmodel.model(model),
            accelerator=costmodel.accelerator(str(self.simulation["accelerator"])),
            gpus=n["gpus"],
            baseline_tp=self.models[model],
            per_worker=n["per_worker"],
            group_size=n["group_size"],
            max_seqs=n["max_seqs"],
            seed=n["seed"],
        )
        return dataclasses.replace(base, **changes)

    def run(self, options: kinds.Options) -> Report:
        if options.steps is not None:
            raise errors.SpecError("heddle runs one rollout step per run", field="--steps")
        keep = set(options.runs or self.runs)
        unknown = keep - set(heddle.SYSTEMS)
        if unknown:
            raise errors.SpecError(
                f"unknown systems {sorted(unknown)}; known: {list(heddle.SYSTEMS)}", field="--runs"
            )
        changes: dict[str, Any] = {}
        if options.seed is not None:
            changes["seed"] = options.seed
        domains = dict(self.domains)
        if options.quick:
            changes["per_worker"] = self.numbers["group_size"]
            domains = dict(list(domains.items())[:1])

        def cell(section: str, names: Sequence[str], domain: str, model: str, **more: Any) -> Cell:
            systems = [heddle.SYSTEMS[n] for n in names if n in keep]
            step = self.step(domains[domain], model, **(changes | more))
            return Cell(section, domain, model, tuple(heddle.run(step, systems)))

        cells = []
        for d in domains:
            for m in self.models:
                cells.append(cell("headline", HEADLINE, d, m))
                cells.append(cell("oracle", ("heddle",), d, m, predictions="noisy-oracle"))
        ablation_model = str(self.simulation["ablation_model"])
        ablations = ("heddle", *(n for group in ABLATIONS.values() for n in group))
        cells += [cell("ablation", ablations, d, ablation_model) for d in domains]
        scale = self.simulation.get("scale_check")
        if scale and str(scale["domain"]) in domains:
            cells.append(
                cell(
                    "scale_check", SCALE_CHECK, str(scale["domain"]), ablation_model, gpus=int(scale["gpus"])
                )
            )
        mirror = self.simulation.get("live_mirror")
        if mirror and str(mirror["domain"]) in domains:
            more = {"max_seqs": int(mirror["max_seqs"])}
            cells.append(
                cell("live_mirror", heddle.LIVE_MIRROR, str(mirror["domain"]), ablation_model, **more)
            )
        return Report(self.name, tuple(cells))


def _fits(system: heddle.System, gpus: int) -> bool:
    return system.tp == "adaptive" or system.tp <= gpus


@dataclasses.dataclass(frozen=True)
class Report:
    scenario: str
    cells: tuple[Cell, ...]

    def find(self, section: str, domain: str, model: str | None = None) -> Cell:
        return next(
            c for c in self.cells if c.section == section and c.domain == domain and model in (None, c.model)
        )

    def table(self) -> str:
        cols = [
            "section",
            "domain",
            "model",
            "system",
            "trajectories",
            "makespan_s",
            "tok/s",
            "TP plan",
            "preemptions",
            "migrations",
        ]
        rows = [
            [
                c.section,
                c.domain,
                c.model,
                r.system,
                str(r.trajectories),
                f"{r.makespan_s:,.0f}",
                f"{r.throughput:,.0f}",
                degrees(r.degrees),
                str(r.preemptions),
                str(r.migrations),
            ]
            for c in self.cells
            for r in c.results
        ]
        header = f"SIMULATED -- scenario {self.scenario}: one synchronous rollout step per run"
        return kinds.table(header, cols, rows)

    def summary(self) -> list[dict[str, Any]]:
        return [
            {"label": "simulated", "section": c.section, "domain": c.domain, "model": c.model, **row(r)}
            for c in self.cells
            for r in c.results
        ]

    def plot(self, out: Path) -> list[str]:
        return []


def row(r: heddle.StepResult) -> dict[str, Any]:
    """``r`` as plain data, with its throughput."""
    out = dataclasses.asdict(r)
    out["throughput"] = r.throughput
    out["accuracy"] = [[s, dataclasses.asdict(a)] for s, a in r.accuracy]
    return out


def degrees(tp: Sequence[int]) -> str:
    """A TP plan as ``2xTP4 + 4xTP1`` (widest first)."""
    counts: dict[int, int] = {}
    for g in tp:
        counts[g] = counts.get(g, 0) + 1
    return " + ".join(f"{n}xTP{g}" for g, n in sorted(counts.items(), reverse=True))
