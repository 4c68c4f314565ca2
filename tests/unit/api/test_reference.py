"""The committed RolloutJob field reference is what ``reference`` generates, covering every field."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from treadle import cli
from treadle.api import crd, reference

ROOT = Path(__file__).resolve().parents[3]


def test_committed_reference_matches_the_models() -> None:
    path = ROOT / reference.REFERENCE_PATH
    assert path.is_file(), f"{path} missing: run `treadle crd --write`"
    assert path.read_text() == reference.render_markdown(), f"{path} is stale: run `treadle crd --write`"


def _fields(node: dict[str, Any], path: str) -> list[tuple[str, str, dict[str, Any]]]:
    """(section, field name, schema) of every field in the schema."""
    if node.get("type") == "array":
        return _fields(node.get("items", {}), path + "[]")
    out = []
    for name, child in node.get("properties", {}).items():
        out.append((path or "RolloutJob", name, child))
        out += _fields(child, f"{path}.{name}" if path else name)
    return out


def _section(page: str, title: str) -> str:
    start = page.index(f"## `{title}`\n")
    end = page.find("\n## ", start + 1)
    return page[start : end if end >= 0 else len(page)]


def test_every_field_has_a_row_with_its_description_and_default() -> None:
    page = reference.render_markdown()
    schema = crd.render_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    fields = _fields(schema, "")
    assert len(fields) > 100
    for section, name, child in fields:
        rows = [line for line in _section(page, section).splitlines() if line.startswith(f"| `{name}` |")]
        assert len(rows) == 1, (section, name)
        first_line = " ".join(str(child.get("description", "")).split())[:40].replace("|", "\\|")
        assert first_line in rows[0], (section, name, rows[0])
        if "default" in child and child.get("type") != "object":
            default = json.dumps(child["default"], separators=(", ", ": "))
            assert f"| `{default}` |" in rows[0], (section, name, rows[0])


def test_pool_row_reads_as_a_user_needs_it() -> None:
    pools = _section(reference.render_markdown(), "spec.pools[]")
    assert (
        "| `replicas` | integer | `1` | Inference replicas (vLLM servers) in the pool. (>= 0; <= 512) |"
        in pools
    )
    assert "| `accelerator` | string | required | " in pools and 'one of `"H800"`, `"H20"`' in pools
    assert "| `tolerations` | [][object](#specpoolstolerations) | `[]` |" in pools


def test_crd_check_fails_on_a_stale_reference(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for rel in [*crd.CRD_PATHS, reference.REFERENCE_PATH]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, tmp_path / rel)
    assert cli.main(["crd", "--check", "--root", str(tmp_path)]) == 0
    page = tmp_path / reference.REFERENCE_PATH
    page.write_text(page.read_text().replace("Inference replicas", "Replicas", 1))
    assert cli.main(["crd", "--check", "--root", str(tmp_path)]) == 1
    assert "rolloutjob.md: differs from what treadle/api generates" in capsys.readouterr().err
    assert cli.main(["crd", "--write", "--root", str(tmp_path)]) == 0
    assert page.read_text() == reference.render_markdown()


def test_docs_flag_prints_the_page(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["crd", "--docs"]) == 0
    assert capsys.readouterr().out == reference.render_markdown()
