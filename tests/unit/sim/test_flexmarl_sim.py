"""The FlexMARL multi-agent simulator: pipeline overlap, rebalancing, accounting (small runs)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from treadle.errors import SpecError
from treadle.sim import flexmarl
from treadle.sim import workloads as w

WORKFLOW = flexmarl.Workflow(
    entry="planner",
    core=("analyst", "strategist"),
    auxiliary=("reporter",),
    core_calls=w.Dist("lognormal", 4, cv=0.6, low=1, high=12),
    auxiliary_p=0.5,
    prompt_tokens=w.Dist("lognormal", 1000, cv=0.3),
    response_tokens=w.Dist("lognormal", 300, cv=1.0, high=8192),
    difficulty_cv=0.8,
)


def _config(**changes: object) -> flexmarl.Config:
    base = flexmarl.Config(
        workflow=WORKFLOW,
        instances={a: 2 for a in WORKFLOW.agents},
        max_seqs=2,
        queries_per_step=4,
        inter_query=4,
        intra_query=8,
        samples_per_query=8,
        micro_batch=8,
        train_gangs=1,
        steps=2,
        rule="per-instance",
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def test_pipeline_overlaps_training_with_rollout() -> None:
    full, wo_async = flexmarl.run(_config(), [flexmarl.VARIANTS["flexmarl"], flexmarl.VARIANTS["w/o async"]])
    assert full.label == "simulated" and len(full.steps) == 2
    # same samples, same work: the barrier only delays training
    assert full.calls == wo_async.calls
    assert [s.tokens for s in full.steps] == [s.tokens for s in wo_async.steps]
    assert full.e2e_s < wo_async.e2e_s
    for s in full.steps:
        assert s.e2e_s > s.rollout_s  # the last micro-batch and the update come after the rollout


def test_rebalancing_moves_instances_towards_the_core_agents_and_keeps_one_each() -> None:
    sim = flexmarl.Sim(_config(), flexmarl.VARIANTS["flexmarl"])
    result = sim.run()
    assert result.migrations == sum(len(m.instance_ids) for m in sim.moves) > 0
    for agent in WORKFLOW.agents:  # nobody is left without an instance (moving ones count for the receiver)
        assert list(sim.home.values()).count(agent) + list(sim.swapping.values()).count(agent) >= 1
    to_core = sum(len(m.instance_ids) for m in sim.moves if m.receiver in WORKFLOW.core)
    assert to_core > result.migrations / 2  # most instances went where most requests queue
    # the core agents serve most calls (FlexMARL Fig. 1b: > 76 %)
    assert sum(result.calls[a] for a in WORKFLOW.core) / sum(result.calls.values()) > 0.6


def test_without_balancing_nothing_moves() -> None:
    (r,) = flexmarl.run(_config(), [flexmarl.VARIANTS["w/o balancing"]])
    assert r.migrations == 0


def test_deterministic_for_a_seed() -> None:
    a = flexmarl.run(_config(seed=3), [flexmarl.VARIANTS["flexmarl"]])[0]
    b = flexmarl.run(_config(seed=3), [flexmarl.VARIANTS["flexmarl"]])[0]
    assert a.steps == b.steps and a.migrations == b.migrations


def test_every_agent_needs_an_instance() -> None:
    with pytest.raises(SpecError):
        flexmarl.Sim(_config(instances={"planner": 1}), flexmarl.VARIANTS["flexmarl"])


def test_shipped_scenario_parses() -> None:
    raw = yaml.safe_load((Path(__file__).parents[3] / "bench/scenarios/flexmarl/marl.yaml").read_text())
    for name, wf in raw["simulation"]["workflows"].items():
        workflow = flexmarl.parse_workflow(wf, field=f"simulation.workflows.{name}")
        assert workflow.core
    with pytest.raises(SpecError):
        flexmarl.parse_workflow({"entry": "a"}, field="simulation.workflows.x")


def test_the_simulator_calls_the_policy_functions(monkeypatch: pytest.MonkeyPatch) -> None:
    """FlexMARL's mechanisms in the simulator are the ``treadle.policy.flexmarl`` functions themselves."""
    from treadle.policy.flexmarl import load_balance, pipeline, sampling

    calls: dict[str, int] = {}
    targets = [
        (sampling, "next_requests"),
        (sampling, "on_output"),
        (load_balance, "dispatch"),
        (load_balance, "rebalance"),
        (pipeline, "next_release"),
        (pipeline, "next_update"),
    ]
    for owner, name in targets:
        original = getattr(owner, name)

        def counted(
            *args: object, _original: object = original, _key: str = name, **kwargs: object
        ) -> object:
            calls[_key] = calls.get(_key, 0) + 1
            return _original(*args, **kwargs)  # type: ignore[operator]

        monkeypatch.setattr(owner, name, counted)
    flexmarl.run(_config(), [flexmarl.VARIANTS["flexmarl"]])
    assert set(calls) == {name for _, name in targets}, calls
