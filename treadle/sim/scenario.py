"""Scenario files: a RolloutJob plus what only the simulator needs, validated into run configs.

Called by the ``rollart`` scenario kind (``treadle.sim.kinds.rollart``: ``treadle simulate``,
``bench/sim_*.py``) and tests. A scenario is YAML (versioned under ``bench/scenarios/``)::

    version: 1
    kind: rollart                                     # optional: the default kind
    name: ...
    job: {apiVersion: treadle.dev/v1alpha1, kind: RolloutJob, ...}   # parsed by treadle.api
    simulation:
      seed: 7
      steps: 6
      systems: [sync-plus, one-off, areal, rollart]   # treadle.sim.systems, in report order
      variants: {name: {base: rollart, affinity: false}}   # optional ablations
      hardware: {run-name: {pools: [...], training: {...}}}  # per-run GPUs (baselines differ)
      models: {agent-name: qwen3-8b}                     # treadle.policy.costmodel.MODELS
      training: {accelerator: H800, gpus: 32}
      reward: {gpus: 4, cold_start_s: 5}
      max_in_flight: 1024
      max_seqs: 128
      workloads: {task-name: {turns: {dist: ..., mean: ..., source: ...}, ...}}

Each system's ``overrides`` are merged into ``job.spec.rollout`` *before* ``treadle.api`` parses
the job, so the simulator reads its policies from the same validated RolloutJob fields as the live
services.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from treadle import api, errors
from treadle.policy import costmodel
from treadle.sim import cost, systems, workloads


@dataclasses.dataclass(frozen=True)
class Training:
    accelerator: costmodel.Accelerator
    gpus: int


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """Everything one simulated run needs."""

    scenario: str
    system: systems.System
    job: api.RolloutJob
    workloads: Mapping[str, workloads.Workload]
    models: Mapping[str, costmodel.ModelShape]
    training: Training
    reward: cost.RewardCost
    reward_gpus: int
    steps: int
    seed: int
    max_in_flight: int
    max_seqs: int


@dataclasses.dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    raw_job: Mapping[str, Any]
    simulation: Mapping[str, Any]
    runs: tuple[str, ...]
    """System (or variant) names in report order."""

    def config(self, run: str, **changes: Any) -> RunConfig:
        """The run called ``run`` (a system or a variant), with top-level ``changes`` applied."""
        return _config(self, run, changes)


def load(path: str | Path) -> Scenario:
    return parse(read(path))


def read(path: str | Path) -> Any:
    """The YAML at ``path`` (any scenario kind's file); ``SpecError`` when it cannot be read."""
    try:
        return yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise errors.SpecError(f"cannot read scenario: {exc}", field="scenario", value=str(path)) from None


def parse(raw: Any) -> Scenario:
    if not isinstance(raw, Mapping):
        raise errors.SpecError("a scenario is a mapping", field="scenario")
    if raw.get("version") != 1:
        raise errors.SpecError("only version 1 is known", field="version", value=raw.get("version"))
    for key in ("name", "job", "simulation"):
        if key not in raw:
            raise errors.SpecError("is required", field=key)
    sim = raw["simulation"]
    if not isinstance(sim, Mapping):
        raise errors.SpecError("must be a mapping", field="simulation")
    names = list(sim.get("systems") or []) + list((sim.get("variants") or {}).keys())
    if not names:
        raise errors.SpecError("name at least one system", field="simulation.systems")
    scenario = Scenario(
        name=str(raw["name"]),
        description=str(raw.get("description", "")),
        raw_job=raw["job"],
        simulation=sim,
        runs=tuple(names),
    )
    for name in names:  # validate every run now, so a bad file fails before anything runs
        scenario.config(name)
    return scenario


def _system(sim: Mapping[str, Any], run: str) -> systems.System:
    variants = sim.get("variants") or {}
    if run in variants:
        spec = dict(variants[run])
        base = systems.system(str(spec.pop("base", "rollart")))
        return dataclasses.replace(systems.with_changes(base, **spec), name=run)
    return systems.system(run)


def _config(scenario: Scenario, run: str, changes: Mapping[str, Any]) -> RunConfig:
    sim = {**scenario.simulation, **changes}
    system = _system(sim, run)
    raw_job = copy.deepcopy(dict(scenario.raw_job))
    spec = raw_job.setdefault("spec", {})
    spec.setdefault("rollout", {}).update(system.overrides)
    hardware = (sim.get("hardware") or {}).get(run, {})
    if "pools" in hardware:
        spec["pools"] = copy.deepcopy(hardware["pools"])
    job = api.parse_job(raw_job, simulation=True)

    agents = {a.name: a for a in job.spec.agents}
    declared_models = sim.get("models") or {}
    models = {}
    for name, agent in agents.items():
        models[name] = costmodel.model(str(declared_models.get(name, agent.model.split("/")[-1].lower())))
    for pool in job.spec.pools:
        costmodel.accelerator(pool.accelerator)  # only H800 and H20 have calibrated costs

    raw_workloads = sim.get("workloads") or {}
    loads = {}
    for task in job.spec.tasks:
        if task.name not in raw_workloads:
            raise errors.SpecError("every task needs a workload", field=f"simulation.workloads.{task.name}")
        loads[task.name] = workloads.parse_workload(
            raw_workloads[task.name], field=f"simulation.workloads.{task.name}"
        )

    training = {**(sim.get("training") or {}), **(hardware.get("training") or {})}
    reward = dict(sim.get("reward") or {})
    reward_gpus = int(reward.pop("gpus", 0))
    try:
        reward_cost = cost.RewardCost(**reward)
    except TypeError as exc:
        raise errors.SpecError(str(exc), field="simulation.reward") from None
    if system.reward == "local" and reward_gpus < 1:
        raise errors.SpecError("local reward needs reward.gpus >= 1", field="simulation.reward.gpus")
    steps = int(sim.get("steps", 5))
    if steps < 1:
        raise errors.SpecError("must be >= 1", field="simulation.steps", value=steps)
    return RunConfig(
        scenario=scenario.name,
        system=system,
        job=job,
        workloads=loads,
        models=models,
        training=Training(
            accelerator=costmodel.accelerator(str(training.get("accelerator", "H800"))),
            gpus=int(training.get("gpus", 32)),
        ),
        reward=reward_cost,
        reward_gpus=reward_gpus,
        steps=steps,
        seed=int(sim.get("seed", 0)),
        max_in_flight=int(sim.get("max_in_flight", job.spec.environment.replicas)),
        max_seqs=int(sim.get("max_seqs", 128)),
    )
