"""A real third-party scanner over what Treadle deploys: checkov (hack/install-checkov.sh) on
``treadle render`` of every example and of manifests/dev/learn.yaml and on ``helm template`` of the
chart. Every finding must be accepted, with its reason, in hack/checkov-accepted.yaml; none on
security context, privilege or probes is (docs/SECURITY.md, "Hardened pods")."""

from __future__ import annotations

import collections
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from treadle.devcluster import binaries

ROOT = Path(__file__).resolve().parents[3]
ACCEPTED = ROOT / "hack" / "checkov-accepted.yaml"
JOBS = [*sorted((ROOT / "manifests" / "examples").glob("*.yaml")), ROOT / "manifests" / "dev" / "learn.yaml"]
NEVER_ACCEPTED = {
    "CKV_K8S_8", "CKV_K8S_9",  # liveness, readiness probes
    "CKV_K8S_10", "CKV_K8S_12", "CKV_K8S_13",  # CPU and memory requests, memory limits
    "CKV_K8S_16", "CKV_K8S_20", "CKV_K8S_28", "CKV_K8S_37", "CKV_K8S_39",  # privilege, capabilities
    "CKV_K8S_29", "CKV_K8S_30", "CKV_K8S_31",  # security contexts, seccomp
}  # fmt: skip


def checkov() -> str:
    cache = Path(os.environ.get("TREADLE_CACHE", Path.home() / ".cache" / "treadle"))
    path = cache / "checkov-venv" / "bin" / "checkov"
    if not path.exists():
        pytest.fail(f"{path} missing: run hack/setup.sh (it runs hack/install-checkov.sh)")
    return str(path)


def manifests(out: Path) -> None:
    for job in JOBS:
        proc = subprocess.run(
            [sys.executable, "-m", "treadle.cli", "render", str(job), "-n", "team"],
            capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
        (out / f"{job.stem}.yaml").write_text(proc.stdout)
    helm = binaries.bin_dir() / "helm"
    proc = subprocess.run(
        [str(helm), "template", "treadle", str(ROOT / "charts" / "treadle"), "-n", "treadle-system",
         "--kube-version", "1.34.0"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    (out / "chart.yaml").write_text(proc.stdout)


def scan(directory: Path) -> list[dict[str, Any]]:
    proc = subprocess.run(
        [checkov(), "-d", str(directory), "--framework", "kubernetes", "--quiet", "--compact", "-o", "json"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode in (0, 1), proc.stderr[-2000:]  # 1: findings
    reports = json.loads(proc.stdout)
    reports = reports if isinstance(reports, list) else [reports]
    assert sum(r["summary"]["resource_count"] for r in reports) > 100, "checkov saw too little to judge"
    return [f for r in reports for f in r["results"]["failed_checks"]]


def test_every_finding_on_the_rendered_jobs_and_the_chart_is_accepted_with_its_reason(tmp_path: Path) -> None:
    accepted: dict[str, dict[str, Any]] = yaml.safe_load(ACCEPTED.read_text())
    assert not set(accepted) & NEVER_ACCEPTED, "security contexts, privilege and probes have no excuse"
    assert all(entry.get("reason") for entry in accepted.values()), "every accepted finding says why"
    manifests(tmp_path)
    findings = scan(tmp_path)
    used: collections.Counter[str] = collections.Counter()
    unexplained = []
    for f in findings:
        entry = accepted.get(f["check_id"])
        patterns = entry.get("resources") if entry else None
        if entry is not None and (patterns is None or any(re.search(p, f["resource"]) for p in patterns)):
            used[f["check_id"]] += 1
        else:
            unexplained.append(f"{f['check_id']} {f['check_name']}: {f['resource']} ({f['file_path']})")
    assert not unexplained, "findings not accepted in hack/checkov-accepted.yaml:\n" + "\n".join(unexplained)
    stale = sorted(set(accepted) - set(used))
    assert not stale, f"accepted findings checkov no longer reports (remove them): {stale}"
