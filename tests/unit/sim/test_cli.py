"""``treadle simulate``: the table, results.json, config.json and the PNG plots."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from treadle import cli


def test_simulate_prints_a_table_and_writes_results_and_plots(
    tiny: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(tiny))
    out = tmp_path / "out"
    code = cli.main(["simulate", str(path), "--runs", "sync-plus,rollart", "--steps", "2", "--out", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "SIMULATED" in printed
    lines = [line.split()[0] for line in printed.splitlines() if line.startswith(("sync-plus", "rollart"))]
    assert lines == ["sync-plus", "rollart"]
    results = json.loads((out / "results.json").read_text())
    assert [r["system"] for r in results] == ["sync-plus", "rollart"]
    assert all(r["label"] == "simulated" and len(r["split_s"]) == 3 for r in results)
    config = json.loads((out / "config.json").read_text())
    assert config["options"] == {"runs": ["sync-plus", "rollart"], "steps": 2}
    for png in ("step_times.png", "in_flight.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bad_scenario_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("version: 1\nname: x\n")
    assert cli.main(["simulate", str(path), "--no-plots", "--out", str(tmp_path / "o")]) == 2
    assert "job" in capsys.readouterr().out
    assert not (tmp_path / "o").exists()  # nothing written
