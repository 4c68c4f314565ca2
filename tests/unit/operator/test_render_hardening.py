"""Every pod the operator renders for the examples (and a job with a trainer) is hardened: Pod
Security "restricted" where its image allows (uid 65532, no capability, no privilege escalation, the
runtime's seccomp profile), "baseline" for the root images of vLLM and the reference trainer; every
container asks for CPU and memory and is capped in memory; every server has a readiness probe. The
API server's own verdict (PodSecurity admission, ``--dry-run=server``) is in
e2e/operator/test_pod_security.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from treadle.api import v1alpha1
from treadle.operator import config, render

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = sorted((ROOT / "manifests" / "examples").glob("*.yaml"))
BASELINE = {"pool", "trainer"}
"""Components whose image runs as root (vLLM's official image, which the reference trainer shares)."""


def jobs() -> Iterator[v1alpha1.RolloutJob]:
    for path in EXAMPLES:
        yield v1alpha1.parse_job(yaml.safe_load(path.read_text()))
    raw = yaml.safe_load((ROOT / "manifests" / "dev" / "learn.yaml").read_text())
    yield v1alpha1.parse_job(raw)  # a trainer Job and a feeder


def pods() -> Iterator[tuple[str, str, dict[str, Any]]]:
    for job in jobs():
        for obj in render.render_children(job, config.OperatorConfig()):
            if obj["kind"] in ("Deployment", "Job"):
                component = obj["metadata"]["labels"]["treadle.dev/component"]
                yield (
                    f"{job.name}/{obj['kind']}/{obj['metadata']['name']}",
                    component,
                    obj["spec"]["template"]["spec"],
                )


PODS = list(pods())


@pytest.mark.parametrize(("where", "component", "pod"), PODS, ids=[p[0] for p in PODS])
def test_every_rendered_pod_is_hardened(where: str, component: str, pod: dict[str, Any]) -> None:
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, where
    assert pod["automountServiceAccountToken"] is False or pod.get("serviceAccountName"), where
    for c in [*pod.get("initContainers", []), *pod["containers"]]:
        at = f"{where}/{c['name']}"
        ctx = {**pod["securityContext"], **c["securityContext"]}
        assert ctx["allowPrivilegeEscalation"] is False, at
        assert not ctx.get("privileged"), at
        assert not ctx.get("capabilities", {}).get("add"), at
        assert ctx["capabilities"] == {"drop": ["ALL"]}, at
        if component not in BASELINE or c["name"] == "agent":
            assert ctx["runAsNonRoot"] is True and ctx["runAsUser"] == 65532, at
        requests, limits = c["resources"].get("requests", {}), c["resources"].get("limits", {})
        assert {"cpu", "memory"} <= set(requests) and "memory" in limits, f"{at}: {c['resources']}"
        if c.get("ports") and component != "trainer":  # a batch Job's metrics port serves no traffic
            assert "readinessProbe" in c, at


def test_the_hardening_covers_every_component() -> None:
    """The parametrised test above sees every kind of pod the operator makes."""
    assert {component for _, component, _ in PODS} >= {
        "pool", "env", "reward", "scheduler", "placement", "buffer", "feeder", "trainer",
    }  # fmt: skip
