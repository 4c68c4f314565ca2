"""One simulator entry: ``treadle simulate`` runs every scenario file in ``bench/scenarios/``.

Each file goes through the CLI function in-process with ``--quick`` (the smallest run of each part of
its kind's own path), so a scenario that ``treadle simulate`` cannot run fails here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from treadle import cli, errors
from treadle.sim import kinds, simulate

SCENARIOS = sorted((Path(__file__).parents[3] / "bench" / "scenarios").rglob("*.yaml"))


def test_every_kind_has_a_scenario_file() -> None:
    kinds_in_files = {yaml.safe_load(p.read_text()).get("kind", simulate.DEFAULT_KIND) for p in SCENARIOS}
    assert kinds_in_files == set(simulate.KINDS)


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: str(p.relative_to(p.parents[1])))
def test_simulate_runs_every_bench_scenario(
    path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli.main(["simulate", str(path), "--quick", "--no-plots", "--out", str(tmp_path)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert printed.startswith("SIMULATED")
    results = json.loads((tmp_path / "results.json").read_text())
    assert results  # every kind reports something, labelled simulated
    assert "simulated" in json.dumps(results)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["options"]["quick"] is True
    assert config["scenario"] == yaml.safe_load(path.read_text())["name"]


def _raw(name: str) -> dict[str, Any]:
    path = next(p for p in SCENARIOS if p.name == name)
    loaded: dict[str, Any] = yaml.safe_load(path.read_text())
    return loaded


@pytest.mark.parametrize(
    ("name", "change", "field"),
    [
        ("agentic.yaml", lambda r: r.update(kind="no-such-kind"), "kind"),
        ("agentic.yaml", lambda r: r["simulation"].pop("per_worker"), "simulation.per_worker"),
        (
            "agentic.yaml",
            lambda r: r["simulation"].update(ablation_model="qwen3-4b"),
            "simulation.ablation_model",
        ),
        (
            "agentic.yaml",
            lambda r: r["simulation"]["domains"]["math"].pop("steps"),
            "simulation.domains.math.steps",
        ),
        ("marl.yaml", lambda r: r["simulation"].pop("seeds"), "simulation.seeds"),
        ("marl.yaml", lambda r: r["simulation"]["workflows"]["MA"].pop("core"), "simulation.workflows.MA"),
        ("marl.yaml", lambda r: r.pop("simulation"), "simulation"),
        ("marl.yaml", lambda r: r["simulation"].update(model="gpt-9"), "simulation.model"),
        (
            "tangram-coding.yaml",
            lambda r: r["simulation"].update(workload="deepsearch"),
            "simulation.workload",
        ),
        ("tangram-coding.yaml", lambda r: r["simulation"]["base"].update(cores=3), "simulation.base.cores"),
        ("tangram-coding.yaml", lambda r: r["simulation"]["base"].pop("serial"), "simulation.base.serial"),
        ("tangram-mopd.yaml", lambda r: r["simulation"].update(systems=["k8s"]), "simulation.systems"),
        (
            "tangram-mopd.yaml",
            lambda r: r["simulation"]["sweeps"].update(batch=[]),
            "simulation.sweeps.batch",
        ),
        ("darts.yaml", lambda r: r["simulation"].pop("lambda"), "simulation.lambda"),
        ("darts.yaml", lambda r: r["simulation"]["workload"].pop("slope"), "simulation.workload.slope"),
        (
            "darts.yaml",
            lambda r: r["simulation"]["setups"]["3b-8gpu"].update(long_end=8),
            "simulation.setups.3b-8gpu.long_end",
        ),
        (
            "darts.yaml",
            lambda r: r["simulation"]["setups"]["3b-8gpu"].update(runs=["darts"]),
            "simulation.setups.3b-8gpu.runs",
        ),
        ("darts.yaml", lambda r: r["simulation"].update(accelerator="TPU"), "simulation.accelerator"),
        ("rollart-fig4.yaml", lambda r: r.pop("job"), "job"),
        ("rollart-fig4.yaml", lambda r: r.update(version=2), "version"),
    ],
)
def test_each_kind_names_the_bad_field(name: str, change: Any, field: str) -> None:
    raw = _raw(name)
    change(raw)
    with pytest.raises(errors.SpecError) as info:
        simulate.parse(raw)
    assert info.value.field == field


@pytest.mark.parametrize(
    ("name", "options", "field"),
    [
        ("agentic.yaml", kinds.Options(steps=2), "--steps"),
        ("agentic.yaml", kinds.Options(runs=("nope",)), "--runs"),
        ("marl.yaml", kinds.Options(runs=("nope",)), "--runs"),
        ("tangram-coding.yaml", kinds.Options(steps=2), "--steps"),
        ("tangram-mopd.yaml", kinds.Options(runs=("fixed-dop=4",)), "--runs"),
        ("darts.yaml", kinds.Options(runs=("nope",)), "--runs"),
    ],
)
def test_bad_options_are_refused_before_anything_runs(name: str, options: kinds.Options, field: str) -> None:
    with pytest.raises(errors.SpecError) as info:
        simulate.parse(_raw(name)).run(options)
    assert info.value.field == field


def test_a_file_without_kind_is_a_rollart_scenario(tiny: dict[str, Any]) -> None:
    assert "kind" not in tiny
    plan = simulate.parse(tiny)
    assert plan.runs[0] == "sync" and set(plan.body) == {"job", "simulation"}
