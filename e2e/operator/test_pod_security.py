"""The API server's own Pod Security admission judges every pod the operator renders: each Deployment's
and Job's pod template, created ``--dry-run=server`` as a Pod in a namespace labelled
``pod-security.kubernetes.io/enforce=restricted`` (and one labelled ``baseline``). Every pod but the
inference pools' and the reference trainer's is admitted under "restricted"; those two run vLLM's
official image, whose user is root, and are refused there for exactly ``runAsNonRoot``, and admitted
under "baseline" (docs/SECURITY.md, "Hardened pods")."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import op_harness
import pytest
import yaml

ROOT = op_harness.ROOT
JOBS = [*sorted((ROOT / "manifests" / "examples").glob("*.yaml")), ROOT / "manifests" / "dev" / "learn.yaml"]
BASELINE_ONLY = {"pool", "trainer"}
NEEDED_FIRST = ("ServiceAccount", "ConfigMap", "Secret")
"""Kinds a pod names (its ServiceAccount, volumes): created for real before the pods are tried."""


@pytest.fixture(scope="module")
def namespaces(kubectl: op_harness.Kubectl) -> Iterator[dict[str, str]]:
    made = {level: f"treadle-psa-{level}" for level in ("restricted", "baseline")}
    for level, ns in made.items():
        kubectl("create", "namespace", ns)
        kubectl("label", "namespace", ns, f"pod-security.kubernetes.io/enforce={level}")
    yield made
    for ns in made.values():
        kubectl("delete", "namespace", ns, "--wait=false")


def _render(path: Path, namespace: str) -> list[dict[str, Any]]:
    proc = subprocess.run(
        [sys.executable, "-m", "treadle.cli", "render", str(path), "-n", namespace],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return [o for o in yaml.safe_load_all(proc.stdout) if o]


def _pods(objects: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    for obj in objects:
        if obj["kind"] in ("Deployment", "Job"):
            template = obj["spec"]["template"]
            pod = {
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": obj["metadata"]["name"], "namespace": obj["metadata"]["namespace"],
                             "labels": template["metadata"]["labels"]},
                "spec": template["spec"],
            }  # fmt: skip
            yield obj["metadata"]["labels"]["treadle.dev/component"], pod


VIOLATIONS = (
    "allowPrivilegeEscalation", "unrestricted capabilities", "runAsNonRoot", "runAsUser=0", "seccompProfile",
    "hostPath", "privileged", "host namespaces", "hostPort",
)  # fmt: skip
"""Words of PodSecurity's refusals, one per kind of violation."""


def expected(level: str, component: str, pod: dict[str, Any]) -> set[str]:
    """What the level may refuse this pod for: nothing, except the documented exceptions (SECURITY.md):
    root in the inference image under "restricted", and hostPath volumes (``weights.store: local``, a
    hostPath dataset volume) under both levels."""
    out = set()
    if level == "restricted" and component in BASELINE_ONLY:
        out.add("runAsNonRoot")
    if any("hostPath" in v for v in pod["spec"].get("volumes", [])):
        out.add("hostPath")
    return out


@pytest.mark.parametrize("path", JOBS, ids=lambda p: p.stem)
def test_pod_security_admits_the_rendered_pods(
    path: Path, kubectl: op_harness.Kubectl, namespaces: dict[str, str]
) -> None:
    tried: dict[str, list[str]] = {}
    for level, ns in namespaces.items():
        objects = _render(path, ns)
        needed = [o for o in objects if o["kind"] in NEEDED_FIRST]
        for o in needed:  # no RolloutJob owns them here (render leaves the owner's uid empty)
            o["metadata"].pop("ownerReferences", None)
        kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(needed))
        for component, pod in _pods(objects):
            proc = kubectl("create", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump(pod), check=False)
            at = f"{level}: {component} ({pod['metadata']['name']})"
            allowed = expected(level, component, pod)
            if not allowed:
                assert proc.returncode == 0, f"{at}: {proc.stderr.strip()}"
            else:
                assert proc.returncode != 0 and "violates PodSecurity" in proc.stderr, f"{at}: admitted"
                found = {v for v in VIOLATIONS if v in proc.stderr}
                assert found and found <= allowed, (
                    f"{at}: refused for {found}, may be for {allowed}: {proc.stderr}"
                )
            tried.setdefault(level, []).append(component)
    assert tried["restricted"] and sorted(tried["restricted"]) == sorted(tried["baseline"])
