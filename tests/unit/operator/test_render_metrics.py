"""Every pod of a job serves /metrics on a port named ``metrics``, told by ``TREADLE_METRICS_PORT``,
and carries the scrape annotations; the Mooncake store (no Treadle metrics) carries neither."""

from __future__ import annotations

from typing import Any

import operator_examples
import pytest
import yaml

from treadle.api import env_vars, v1alpha1
from treadle.operator import config, render

CFG = config.OperatorConfig()
TRAINER = {"steps": 2, "image": "trainer:1"}


def jobs() -> list[v1alpha1.RolloutJob]:
    out = [operator_examples.load_example(p) for p in operator_examples.EXAMPLES]
    doc = yaml.safe_load(operator_examples.EXAMPLES[0].read_text())
    doc["spec"]["trainer"] = TRAINER
    return [*out, v1alpha1.parse_job(doc)]


def pod_templates(job: v1alpha1.RolloutJob) -> list[tuple[str, dict[str, Any]]]:
    """(component, pod template) of every Deployment and Job rendered for ``job``."""
    return [
        (c["metadata"]["labels"]["treadle.dev/component"], c["spec"]["template"])
        for c in render.render_children(job, CFG)
        if c["kind"] in ("Deployment", "Job")
    ]


@pytest.mark.parametrize("job", jobs(), ids=lambda j: j.name)
def test_every_pod_serves_metrics_on_its_named_port_and_says_so(job: v1alpha1.RolloutJob) -> None:
    components = set()
    for component, template in pod_templates(job):
        components.add(component)
        annotations = template["metadata"].get("annotations", {})
        serving = [
            c for c in template["spec"]["containers"] if any(p["name"] == "metrics" for p in c["ports"])
        ]
        if component == "weights":
            assert not serving and "prometheus.io/scrape" not in annotations
            continue
        # One per pod: containers share the pod's network, and vLLM serves its own on its API port.
        (container,) = serving
        (port,) = [p["containerPort"] for p in container["ports"] if p["name"] == "metrics"]
        env = {e["name"]: e["value"] for e in container["env"]}
        assert env[env_vars.METRICS_PORT] == str(port), component
        assert annotations["prometheus.io/scrape"] == "true"
        assert annotations["prometheus.io/port"] == str(port)
        assert annotations["prometheus.io/path"] == "/metrics"
    assert {"scheduler", "placement", "buffer", "env", "reward", "pool"} <= components
    assert ("trainer" in components) == (job.spec.trainer is not None)


def test_a_trainer_of_the_users_own_declares_no_metrics_port() -> None:
    """Only the reference trainer is known to serve /metrics; a port nobody serves is a target down."""
    doc = yaml.safe_load(operator_examples.EXAMPLES[0].read_text())
    doc["spec"]["trainer"] = {**TRAINER, "command": ["python", "train.py"]}
    ((_, template),) = [t for t in pod_templates(v1alpha1.parse_job(doc)) if t[0] == "trainer"]
    assert "prometheus.io/scrape" not in template["metadata"]["annotations"]
    assert all("ports" not in c for c in template["spec"]["containers"])
