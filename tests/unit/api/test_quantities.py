"""Quantities (``resources``, ``externalResources.cpuCoresPerAction``) as Kubernetes takes them:
int-or-string. ``cpu: 8`` is ``cpu: "8"``; a number the API server refuses (``0.5``), a negative one,
or a string that is no quantity is refused naming its field."""

from __future__ import annotations

import copy
import math
import re
from pathlib import Path
from typing import Any

import api_specs
import pytest
import yaml

from treadle import errors
from treadle.api import base, crd, spec_rules, v1alpha1
from treadle.operator import config, render

ROOT = Path(__file__).resolve().parents[3]
MATH = ROOT / "manifests" / "examples" / "math-tool-h20.yaml"


@pytest.mark.parametrize(
    ("written", "held"),
    [
        (8, "8"),
        (8.0, "8"),  # the API server takes an integral number for an integer
        (0, "0"),
        (2000, "2k"),  # as Kubernetes prints a pod's cpu: 2000
        (1073741824, "1073741824"),  # a plain number is decimal: not 1Gi
        (123000, "123k"),
        ("500m", "500m"),
        ("1024Mi", "1024Mi"),  # a string is kept as written
    ],
)
def test_numbers_and_strings_are_held_as_the_strings_kubernetes_prints(written: object, held: str) -> None:
    spec = v1alpha1.parse_spec(
        api_specs.minimal(
            environment={"resources": {"requests": {"cpu": written, "memory": written}}},
            externalResources={"cpuCoresPerAction": written},
        )
    )
    assert spec.environment.resources.requests.cpu == held
    assert spec.environment.resources.requests.memory == held
    assert spec.external_resources.cpu_cores_per_action == held


@pytest.mark.parametrize(
    ("written", "says"),
    [
        ("two", "must be a Kubernetes quantity such as 2, 500m or 4Gi"),
        ("-1Gi", "no sign"),
        ("4 GB", "got '4 GB'"),
        ("1" * 40, "at most 32 characters"),
        (-1, "must not be negative"),
        (0.5, "write '500m'"),  # int-or-string: the API server refuses any other number
        (1.5, "write '1500m'"),
        (math.inf, "must be a Kubernetes quantity"),
        (True, "an integer or a string"),
        ([1], "an integer or a string"),
    ],
)
def test_a_bad_quantity_is_refused_naming_its_field(written: object, says: str) -> None:
    pools = [
        {
            "name": "p",
            "agent": "a",
            "accelerator": "H20",
            "engine": {"resources": {"limits": {"cpu": written}}},
        }
    ]
    with pytest.raises(errors.SpecError) as info:
        v1alpha1.parse_spec(api_specs.minimal(pools=pools))
    assert info.value.field == "spec.pools[0].engine.resources.limits.cpu"
    assert says in str(info.value), str(info.value)
    assert "Value error" not in str(info.value)


def test_cpu_cores_per_action_is_a_quantity_too() -> None:
    with pytest.raises(errors.SpecError) as info:
        v1alpha1.parse_spec(api_specs.minimal(externalResources={"cpuCoresPerAction": 0.25}))
    assert info.value.field == "spec.externalResources.cpuCoresPerAction"
    assert "write '250m'" in str(info.value)


def test_limits_compare_across_the_two_forms() -> None:
    """``limits: {memory: 1073741824}`` equals ``requests: {memory: 1Gi}``; below it is refused."""
    equal = {"requests": {"cpu": "1500m", "memory": "1Gi"}, "limits": {"cpu": 2, "memory": 1073741824}}
    assert v1alpha1.parse_spec(api_specs.minimal(trainer={"resources": equal})).trainer is not None
    below = {"requests": {"memory": "2Gi"}, "limits": {"memory": 1073741824}}
    with pytest.raises(errors.SpecError) as info:
        v1alpha1.parse_spec(api_specs.minimal(trainer={"resources": below}))
    assert info.value.field == "spec.trainer.resources"


def _quantity_nodes(node: Any, path: str = "spec") -> list[tuple[str, dict[str, Any]]]:
    out: list[tuple[str, dict[str, Any]]] = []
    if isinstance(node, dict):
        if node.get("pattern") == base.QUANTITY:
            out.append((path, node))
        for key, sub in node.get("properties", {}).items():
            out += _quantity_nodes(sub, f"{path}.{key}")
        if "items" in node:
            out += _quantity_nodes(node["items"], f"{path}[]")
    return out


def test_every_quantity_in_the_crd_is_int_or_string() -> None:
    nodes = _quantity_nodes(crd.spec_schema())
    paths = {path for path, _ in nodes}
    # requests and limits (cpu, memory) of four containers, and cpuCoresPerAction
    assert len(paths) == 17 and "spec.externalResources.cpuCoresPerAction" in paths, sorted(paths)
    assert (
        "spec.pools[].engine.resources.requests.cpu" in paths
        and "spec.trainer.resources.limits.memory" in paths
    )
    for path, node in nodes:
        assert node[crd.INT_OR_STRING] is True, path
        assert node["anyOf"] == [{"type": "integer"}, {"type": "string"}], path
        assert "type" not in node, path
        assert node["minimum"] == 0 and node["maxLength"] == base.QUANTITY_MAX_LENGTH, path


# Before Kubernetes 1.34 the API server sizes an int-or-string as a whole request whatever its
# maxLength: each quantity() of one costs this much of a rule's static budget (10M), and the CRD's
# rules together may cost 100M (apiextensions' StaticEstimatedCostLimit, StaticEstimatedCRDCostLimit).
QUANTITY_CALL_COST = math.ceil((3 * 1024 * 1024 - 2) * 0.1)
_QUANTITY_OF_FIELD = re.compile(r"quantity\((?!'0'\))([A-Za-z_]\w*)\.")


def test_quantity_rules_fit_the_api_servers_cost_budget() -> None:
    """A quantity() of a field only in a rule on the spec itself, over ``self`` (not over a list's
    items, which multiply its cost): the pools' limits are compared by the API server as integers."""
    total = 0
    for rule in spec_rules.SPEC_RULES:
        roots = _QUANTITY_OF_FIELD.findall(rule.cel)
        if not roots:
            continue
        assert rule.path == () and set(roots) == {"self"}, rule.cel
        assert len(roots) * QUANTITY_CALL_COST < 10_000_000, rule.message
        total += len(roots) * QUANTITY_CALL_COST
    assert 0 < total < 100_000_000
    pools = next(r for r in spec_rules.SPEC_RULES if r.field == "spec.pools.engine.resources")
    assert "quantity(" not in pools.cel and "int(p.engine.resources.limits.cpu)" in pools.cel


def _with_resources(quantities: dict[str, Any]) -> v1alpha1.RolloutJob:
    doc = yaml.safe_load(MATH.read_text())
    doc["metadata"] |= {"namespace": "team-a", "uid": "0000-uid-quantities", "generation": 1}
    spec = doc["spec"]
    spec["environment"] = {**spec.get("environment", {}), "resources": quantities["environment"]}
    spec["feeder"] = {**spec.get("feeder", {}), "resources": quantities["feeder"]}
    spec["externalResources"] = {
        **spec.get("externalResources", {}),
        "cpuCoresPerAction": quantities["action"],
    }
    for pool in spec["pools"]:
        pool["engine"] = {**pool.get("engine", {}), "resources": quantities["engine"]}
    spec["trainer"] = {"accelerator": "H800", "gpus": 1, "resources": quantities["trainer"]}
    return v1alpha1.parse_job(doc)


NUMBERS: dict[str, Any] = {
    "environment": {
        "requests": {"cpu": 2, "memory": 4294967296},
        "limits": {"cpu": 2.0, "memory": 4294967296},
    },
    "feeder": {"requests": {"cpu": 1, "memory": 2000000000}, "limits": {"memory": 2000000000}},
    "engine": {"requests": {"cpu": 8, "memory": 1073741824}, "limits": {"cpu": 16, "memory": 68719476736}},
    "trainer": {"requests": {"cpu": 4, "memory": 8000}, "limits": {"cpu": 4, "memory": 8000}},
    "action": 2,
}
STRINGS: dict[str, Any] = {
    "environment": {
        "requests": {"cpu": "2", "memory": "4294967296"},
        "limits": {"cpu": "2", "memory": "4294967296"},
    },
    "feeder": {"requests": {"cpu": "1", "memory": "2G"}, "limits": {"memory": "2G"}},
    "engine": {
        "requests": {"cpu": "8", "memory": "1073741824"},
        "limits": {"cpu": "16", "memory": "68719476736"},
    },
    "trainer": {"requests": {"cpu": "4", "memory": "8k"}, "limits": {"cpu": "4", "memory": "8k"}},
    "action": "2",
}


def test_the_numeric_and_string_forms_of_a_job_render_identical_children() -> None:
    """Every child the operator renders (pods' resources, the job's config, the spec hashes and the
    trainer Job's name) is the same whichever form the quantities were written in."""
    cfg = config.OperatorConfig()
    numeric = render.render_children(_with_resources(copy.deepcopy(NUMBERS)), cfg)
    strings = render.render_children(_with_resources(copy.deepcopy(STRINGS)), cfg)
    assert yaml.safe_dump_all(numeric, sort_keys=True) == yaml.safe_dump_all(strings, sort_keys=True)
    pods = [c for c in numeric if c["kind"] in ("Deployment", "StatefulSet", "Job")]
    resources = [
        container["resources"]
        for child in pods
        for container in child["spec"]["template"]["spec"]["containers"]
    ]
    requests = [r.get("requests") for r in resources]
    assert {"cpu": "8", "memory": "1073741824", "nvidia.com/gpu": "2"} in requests  # the pool's engine (TP 2)
    assert {"cpu": "4", "memory": "8k", "nvidia.com/gpu": "1"} in requests  # the trainer
    assert {"cpu": "2", "memory": "4294967296"} in requests  # the environment
