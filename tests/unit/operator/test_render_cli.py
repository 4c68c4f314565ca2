"""``treadle render FILE``: the operator's renderers on each example; invalid jobs exit 2 naming the field."""

from __future__ import annotations

import json
from pathlib import Path

import operator_examples
import pytest
import yaml

from treadle import cli
from treadle.api import v1alpha1
from treadle.operator import config, render

INVALID = sorted((operator_examples.ROOT / "manifests" / "invalid").glob("*.yaml"))


def _header(path: Path, key: str) -> str | None:
    for line in path.read_text().splitlines():
        if line.startswith(f"# {key}:"):
            return line.split(":", 1)[1].strip()
    return None


def _expected(path: Path, namespace: str) -> list[dict[str, object]]:
    doc = yaml.safe_load(path.read_text())
    doc["metadata"]["namespace"] = namespace
    return render.render_children(v1alpha1.parse_job(doc), config.OperatorConfig.from_env())


@pytest.mark.parametrize("path", operator_examples.EXAMPLES, ids=lambda p: p.stem)
def test_render_prints_what_render_children_returns(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["render", str(path), "-n", "team-a"]) == 0
    printed = list(yaml.safe_load_all(capsys.readouterr().out))
    assert printed == _expected(path, "team-a")
    assert len(printed) >= 10  # the job's ConfigMap, coordination, backends and at least one pool


@pytest.mark.parametrize("path", operator_examples.EXAMPLES[:1], ids=lambda p: p.stem)
def test_render_json_is_a_list_of_the_same_objects(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["render", str(path), "-o", "json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["kind"] == "List"
    assert printed["items"] == _expected(path, "default")  # no namespace in the file, none given


@pytest.mark.parametrize(
    "path", [p for p in INVALID if not _header(p, "update-of")], ids=lambda p: p.stem
)  # update-of manifests are valid alone: only the API server's immutability rules refuse them
def test_invalid_job_exits_2_naming_the_field(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    field = _header(path, "field")
    assert field
    assert cli.main(["render", str(path)]) == 2
    out = capsys.readouterr()
    assert out.out == ""
    assert field in out.err, out.err


def test_a_document_that_is_not_an_object_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "list.yaml"
    bad.write_text("- 1\n- 2\n")
    assert cli.main(["render", str(bad)]) == 2
    assert "RolloutJob object" in capsys.readouterr().err
