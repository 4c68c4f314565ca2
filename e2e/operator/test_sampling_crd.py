"""``tasks[].sampling`` on a real API server: valid modes are accepted as ``parse_spec`` accepts them.

The refusals are covered by ``manifests/invalid/18-20`` in ``test_operator``; this checks the other
side of the CEL rules: a ``darts`` task, a ``redundancy``-only task (today's behaviour, no
``sampling``) and a named ``redundant`` task pass a server-side dry run, and the server's defaults
leave ``sampling`` empty (no mode) where the manifest gave none, as the Python model does.
"""

from __future__ import annotations

import json
from typing import Any

import op_harness
import pytest
import yaml

from treadle.api import v1alpha1


def _job(name: str, **task: Any) -> dict[str, Any]:
    return {
        "apiVersion": v1alpha1.API_VERSION,
        "kind": v1alpha1.KIND,
        "metadata": {"name": name},
        "spec": {
            "agents": [{"name": "a", "model": "m"}],
            "pools": [{"name": "p", "agent": "a", "accelerator": "H20"}],
            "tasks": [{"name": "t", "agents": ["a"], "environment": "math-tool", "reward": "math", **task}],
        },
    }


@pytest.mark.parametrize(
    ("name", "task"),
    [
        ("darts-defaults", {"sampling": {"mode": "darts"}}),
        (
            "darts-full",
            {"sampling": {"mode": "darts", "mUp": 12, "longEnd": 2, "lambda": 0.1, "emaDecay": 0.9}},
        ),
        ("redundancy-only", {"redundancy": 0.5}),
        ("redundant-named", {"redundancy": 0.5, "sampling": {"mode": "redundant"}}),
        ("standard-named", {"sampling": {"mode": "standard"}}),
    ],
)
def test_valid_sampling_is_accepted_by_the_api_server(
    name: str, task: dict[str, Any], chart: str, kubectl: op_harness.Kubectl
) -> None:
    doc = _job(name, **task)
    v1alpha1.parse_job(doc)  # the Python side accepts it too
    proc = kubectl(
        "apply", "--dry-run=server", "-n", op_harness.JOBS_NS, "-o", "json", "-f", "-",
        stdin=yaml.safe_dump(doc), check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    stored = json.loads(proc.stdout)["spec"]["tasks"][0]
    assert stored["sampling"] == task.get("sampling", {})
