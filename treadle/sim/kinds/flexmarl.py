"""The ``flexmarl`` scenario kind: FlexMARL's variants over multi-agent workflows (``treadle.sim.flexmarl``).

The body is ``simulation``: the model and accelerator, instances per agent, the batch (queries,
samples, micro-batch), training gangs, the update/swap/poll times, ``delta``, ``seeds`` and
``steps``, ``workflows`` (``flexmarl.parse_workflow``) and the optional sweeps
``sensitivity_max_seqs`` and ``sensitivity_train_gangs``. Every cell is the mean over the seeds of
each variant (``flexmarl.VARIANTS``): ``<workflow>/<rule>`` for both rebalancing rules, then
``<workflow>/max_seqs=<n>`` and ``<workflow>/train_gangs=<n>`` (per-instance rule) for the sweeps.
``--seed`` runs one seed; ``--quick`` runs the first seed, one step, and the first value of each sweep.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from treadle import errors
from treadle.policy import costmodel
from treadle.sim import flexmarl, kinds

NAME = "flexmarl"
INTS = (
    "steps",
    "instances_per_agent",
    "max_seqs",
    "queries_per_step",
    "inter_query",
    "intra_query",
    "samples_per_query",
    "micro_batch",
    "train_gangs",
    "train_gpus_per_gang",
)
FLOATS = ("update_s", "swap_s", "poll_s", "delta")
RULES = ("literal", "per-instance")
METRICS = ("e2e_s", "throughput", "rollout_s", "migrations", "train_busy_share", "core_share")


def parse(raw: Any) -> Plan:
    raw = kinds.envelope(raw, NAME)
    sim = kinds.section(raw, "simulation", ("seeds", "model", "accelerator", "workflows", *INTS, *FLOATS))
    kinds.known(sim["model"], costmodel.MODELS, "simulation.model")
    kinds.known(sim["accelerator"], costmodel.ACCELERATORS, "simulation.accelerator")
    try:
        numbers: dict[str, Any] = {k: int(sim[k]) for k in INTS} | {k: float(sim[k]) for k in FLOATS}
        seeds = tuple(int(s) for s in sim["seeds"])
        sweeps = {
            k: tuple(int(v) for v in sim.get(f"sensitivity_{k}", ())) for k in ("max_seqs", "train_gangs")
        }
    except (TypeError, ValueError) as exc:
        raise errors.SpecError(f"bad value: {exc}", field="simulation") from None
    if not seeds:
        raise errors.SpecError("name at least one seed", field="simulation.seeds")
    if not isinstance(sim["workflows"], Mapping) or not sim["workflows"]:
        raise errors.SpecError("name at least one workflow", field="simulation.workflows")
    workflows = {
        str(name): flexmarl.parse_workflow(w, field=f"simulation.workflows.{name}")
        for name, w in sim["workflows"].items()
    }
    return Plan(
        name=str(raw["name"]),
        description=str(raw.get("description", "")),
        simulation=sim,
        workflows=workflows,
        numbers=numbers,
        seeds=seeds,
        sweeps=sweeps,
    )


@dataclasses.dataclass(frozen=True)
class Plan:
    name: str
    description: str
    simulation: Mapping[str, Any]
    workflows: Mapping[str, flexmarl.Workflow]
    numbers: Mapping[str, Any]
    seeds: tuple[int, ...]
    sweeps: Mapping[str, tuple[int, ...]]
    """``max_seqs`` and ``train_gangs`` -> the values their sensitivity sweep tries."""

    @property
    def runs(self) -> tuple[str, ...]:
        return tuple(flexmarl.VARIANTS)

    @property
    def body(self) -> Mapping[str, Any]:
        return {"simulation": self.simulation}

    def config(self, workflow: flexmarl.Workflow, seed: int, **changes: Any) -> flexmarl.Config:
        """The run configuration of ``workflow`` under ``seed`` (``changes`` replace its fields)."""
        n = self.numbers
        base = flexmarl.Config(
            workflow=workflow,
            model=costmodel.model(str(self.simulation["model"])),
            accelerator=costmodel.accelerator(str(self.simulation["accelerator"])),
            instances={a: n["instances_per_agent"] for a in workflow.agents},
            **{k: n[k] for k in (*INTS, *FLOATS) if k != "instances_per_agent"},
            seed=seed,
        )
        return dataclasses.replace(base, **changes)

    def run(self, options: kinds.Options) -> kinds.Cells:
        variants = [_variant(v) for v in options.runs or self.runs]
        seeds = (options.seed,) if options.seed is not None else self.seeds[: 1 if options.quick else None]
        base: dict[str, Any] = {}
        if options.steps is not None:
            base["steps"] = options.steps
        elif options.quick:
            base["steps"] = 1
        sweeps = {k: v[:1] if options.quick else v for k, v in self.sweeps.items()}
        cells: dict[str, dict[str, dict[str, float]]] = {}
        for dname, wf in self.workflows.items():
            for rule in RULES:
                cells[f"{dname}/{rule}"] = self._mean(wf, variants, seeds, rule=rule, **base)
        for key, values in sweeps.items():
            for dname, wf in self.workflows.items():
                for v in values:
                    cells[f"{dname}/{key}={v}"] = self._mean(
                        wf, variants, seeds, rule="per-instance", **{key: v}, **base
                    )
        return kinds.Cells(
            self.name, cells, METRICS, ("cell", "variant"), "means over the seeds, seconds per step"
        )

    def _mean(
        self,
        wf: flexmarl.Workflow,
        variants: Sequence[flexmarl.Variant],
        seeds: Sequence[int],
        **changes: Any,
    ) -> dict[str, dict[str, float]]:
        """Per variant: the mean over ``seeds`` of each of ``METRICS``."""
        runs: dict[str, list[flexmarl.Result]] = {}
        for seed in seeds:
            for r in flexmarl.run(self.config(wf, seed, **changes), variants):
                runs.setdefault(r.variant, []).append(r)
        out = {}
        for name, rs in runs.items():
            out[name] = {
                "e2e_s": statistics.fmean(r.e2e_s for r in rs),
                "throughput": statistics.fmean(r.throughput for r in rs),
                "rollout_s": statistics.fmean(statistics.fmean(s.rollout_s for s in r.steps) for r in rs),
                "migrations": statistics.fmean(r.migrations for r in rs),
                "train_busy_share": statistics.fmean(r.train_busy_share for r in rs),
                "core_share": statistics.fmean(
                    sum(r.calls[a] for a in wf.core) / sum(r.calls.values()) for r in rs
                ),
            }
        return out


def _variant(name: str) -> flexmarl.Variant:
    try:
        return flexmarl.VARIANTS[name]
    except KeyError:
        raise errors.SpecError(
            f"unknown variant {name!r}; known: {list(flexmarl.VARIANTS)}", field="--runs"
        ) from None
