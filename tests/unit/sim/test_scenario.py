"""Scenario files and workloads: every shipped scenario parses; bad input names its field."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from treadle import errors
from treadle.sim import engine, scenario, workloads

# RollArt's scenario files (the other kinds have their own parsers and tests: tests/unit/sim/test_simulate.py)
SCENARIOS = sorted(
    p
    for p in (Path(__file__).parents[3] / "bench" / "scenarios").rglob("*.yaml")
    if scenario.read(p).get("kind", "rollart") == "rollart"
)


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_every_shipped_scenario_parses_and_names_its_sources(path: Path) -> None:
    sc = scenario.load(path)
    assert sc.runs
    for run in sc.runs:
        cfg = sc.config(run)
        for name, load in cfg.workloads.items():
            for field in workloads.WORKLOAD_FIELDS:
                assert getattr(load, field).source, f"{path.name}: {name}.{field} has no source"


def _set(raw: dict[str, Any], path: str, value: Any) -> None:
    """Set (or, with ``None``, delete) the dotted ``path``; digits index lists."""
    node: Any = raw
    keys = [int(k) if k.isdigit() else k for k in path.split(".")]
    for key in keys[:-1]:
        node = node[key]
    if value is None:
        del node[keys[-1]]
    else:
        node[keys[-1]] = value


@pytest.mark.parametrize(
    "path,value,field",
    [
        ("version", 2, "version"),
        ("simulation.systems", ["warp-drive"], "simulation.systems"),
        ("simulation.workloads.math", None, "simulation.workloads.math"),
        (
            "simulation.workloads.game.turns",
            {"dist": "lognormal", "mean": 3},
            "simulation.workloads.game.turns.source",
        ),
        (
            "simulation.workloads.game.turns",
            {"dist": "zipf", "mean": 3, "source": "x"},
            "simulation.workloads.game.turns.dist",
        ),
        ("simulation.workloads.game.reset_failure_p", 2.0, "simulation.workloads.game.reset_failure_p"),
        ("simulation.reward.gpus", 0, "simulation.reward.gpus"),  # sync uses dedicated reward GPUs
        ("simulation.steps", 0, "simulation.steps"),
        ("job.spec.rollout.placementPolicy", "telepathy", "rollout.placementPolicy"),
        ("job.spec.rollout.schedulingPolicy", "telepathy", "rollout.schedulingPolicy"),
        ("job.spec.pools.0.accelerator", "A100", "accelerator"),  # valid in the API, no calibrated cost
        ("job.spec.rollout.batchSize", 0, "spec.rollout.batchSize"),  # the API's own validation
    ],
    ids=lambda v: str(v)[:30] if not isinstance(v, dict) else "mapping",
)
def test_bad_scenarios_name_the_field(tiny: dict[str, Any], path: str, value: Any, field: str) -> None:
    _set(tiny, path, value)
    with pytest.raises(errors.SpecError) as info:
        sc = scenario.parse(tiny)
        for run in sc.runs:  # policies are looked up when a run is built
            engine.Simulator(sc.config(run))
    assert info.value.field.endswith(field) or info.value.field == field


def test_draw_is_seeded_and_respects_the_context_cap(tiny: dict[str, Any]) -> None:
    load = workloads.parse_workload(
        {**tiny["simulation"]["workloads"]["game"], "max_context": 2000}, field="w"
    )
    a = [workloads.draw(load, random.Random(1)) for _ in range(50)]
    b = [workloads.draw(load, random.Random(1)) for _ in range(50)]
    assert a == b
    for shape in a:
        assert sum(shape.inputs) + sum(shape.responses) <= 2000
        assert len(shape.inputs) == len(shape.responses) == len(shape.tools) >= 1


def test_lognormal_draws_have_the_declared_mean() -> None:
    dist = workloads.parse_dist({"dist": "lognormal", "mean": 100, "cv": 1.0, "source": "test"}, field="x")
    rng = random.Random(0)
    samples = [dist.sample(rng) for _ in range(20_000)]
    assert sum(samples) / len(samples) == pytest.approx(100, rel=0.05)
    assert max(samples) / 100 > 5  # a long tail, as RollArt's max/mean of 5-9x


def test_choice_draws_each_value_by_its_weight() -> None:
    dist = workloads.parse_dist(
        {"dist": "choice", "values": [32, 2], "weights": [1, 60], "source": "test"}, field="x"
    )
    assert (dist.low, dist.high, dist.mean) == (2.0, 32.0, pytest.approx((32 + 120) / 61))
    rng = random.Random(0)
    samples = [dist.sample(rng) for _ in range(6_100)]
    assert set(samples) == {2.0, 32.0}
    assert samples.count(32.0) == pytest.approx(100, abs=30)


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"values": [], "weights": []}, "x.values"),
        ({"values": [1, "a"], "weights": [1, 1]}, "x.values"),
        ({"values": [1, 2], "weights": [1]}, "x.weights"),
        ({"values": [1, 2], "weights": [1, 0]}, "x.weights"),
    ],
)
def test_a_bad_choice_names_its_field(raw: dict[str, Any], field: str) -> None:
    with pytest.raises(errors.SpecError) as info:
        workloads.parse_dist({"dist": "choice", "source": "test", **raw}, field="x")
    assert info.value.field == field
