"""Applying a Heddle TP plan to a job's pools: the mapping, the patch, and errors that name the field."""

from __future__ import annotations

import copy
from typing import Any

import operator_examples
import pytest
import yaml

from treadle.errors import SpecError
from treadle.operator import reshape
from treadle.policy.heddle import tp_planner

NODES = {"H800": 8, "H20": 8}
POOL0 = "spec.pools[0]"


def _job(example: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(
        (operator_examples.ROOT / "manifests" / "examples" / example).read_text()
    )
    doc["metadata"] |= {"namespace": "team-a", "uid": "u", "generation": 1}
    return doc


def _shapes(pools: list[dict[str, Any]]) -> list[tuple[str, int, int]]:
    return [(p["name"], p["replicas"], p.get("tensorParallelSize", 1)) for p in pools]


def _plan(agent: str, replicas: dict[Any, Any], accelerator: str | None = None) -> reshape.PlanFile:
    doc: dict[str, Any] = {"agent": agent, "replicas": replicas}
    if accelerator is not None:
        doc["accelerator"] = accelerator
    return reshape.parse_plan(doc)


@pytest.mark.parametrize(
    ("replicas", "expected"),
    [
        ({4: 4}, [("prefill", 4, 4)]),                        # same degree: replicas only
        ({8: 1}, [("prefill", 1, 8)]),                        # new degree: the pool changes TP in place
        ({8: 1, 2: 4}, [("prefill", 1, 8), ("prefill-tp2", 4, 2)]),  # a second degree: a new pool
        ({"4": 1, "2": 2}, [("prefill", 1, 4), ("prefill-tp2", 2, 2)]),  # JSON string keys
    ],
    ids=["replicas-only", "tp-in-place", "split-into-two", "string-keys"],
)  # fmt: skip
def test_plan_maps_onto_named_pools(replicas: dict[Any, int], expected: list[tuple[str, int, int]]) -> None:
    job = _job("swe-h800.yaml")
    pools = reshape.new_pools(job, _plan("coder", replicas), gpus_per_node=NODES)
    assert _shapes(pools) == expected
    for pool in pools:  # new pools copy the template's placement
        assert pool["accelerator"] == "H800" and pool["preferredWork"] == "prefill-heavy"


def test_a_pool_left_out_of_the_plan_is_drained_not_removed() -> None:
    job = _job("swe-h800.yaml")
    two = reshape.new_pools(job, _plan("coder", {8: 1, 2: 4}), gpus_per_node=NODES)
    job["spec"]["pools"] = two
    back = reshape.new_pools(job, _plan("coder", {2: 8}), gpus_per_node=NODES)
    assert _shapes(back) == [("prefill", 0, 8), ("prefill-tp2", 8, 2)]


def test_other_agents_and_accelerators_are_untouched() -> None:
    job = _job("multi-task-mixed.yaml")
    before = copy.deepcopy(job["spec"]["pools"])
    pools = reshape.new_pools(job, _plan("policy", {4: 1}, accelerator="H20"), gpus_per_node=NODES)
    assert pools[0] == before[0]  # the H800 pool of the same agent
    assert _shapes(pools)[1] == ("decode", 1, 4)


def test_the_patch_tests_what_it_read_then_replaces_only_the_pools() -> None:
    job = _job("swe-h800.yaml")
    pools = reshape.new_pools(job, _plan("coder", {8: 1}), gpus_per_node=NODES)
    ops = reshape.json_patch(job, pools)
    assert ops == [
        {"op": "test", "path": "/spec/pools", "value": job["spec"]["pools"]},
        {"op": "replace", "path": "/spec/pools", "value": pools},
    ]
    assert reshape.describe(job["spec"]["pools"], pools) == ["prefill: 2 x TP4 -> 1 x TP8"]


def test_pool_reshape_from_the_planner_is_what_the_file_holds() -> None:
    planned = tp_planner.Plan(degrees=(8, 2, 2), makespan=1.0, start_makespan=2.0, energy=1.0, evaluations=1)
    found = tp_planner.reshape([4, 4], planned)
    assert found is not None
    assert _plan("coder", {8: 1, 2: 2}).reshape == found


@pytest.mark.parametrize(
    ("example", "plan", "nodes", "field"),
    [
        ("swe-h800.yaml", {"agent": "coder", "replicas": {8: 1}}, {"H800": 4}, f"{POOL0}.tensorParallelSize"),
        ("swe-h800.yaml", {"agent": "nobody", "replicas": {8: 1}}, NODES, "agent"),
        ("multi-task-mixed.yaml", {"agent": "policy", "replicas": {2: 1}}, NODES, "accelerator"),
        ("swe-h800.yaml", {"agent": "coder", "accelerator": "H20", "replicas": {2: 1}}, NODES, "accelerator"),
        ("swe-h800.yaml", {"agent": "coder", "replicas": {3: 2}}, NODES, f"{POOL0}.tensorParallelSize"),
        ("swe-h800.yaml", {"agent": "coder", "replicas": {8: -1}}, NODES, "replicas.8"),
        ("swe-h800.yaml", {"agent": "coder", "replicas": {"x": 1}}, NODES, "replicas.x"),
        ("swe-h800.yaml", {"agent": "coder"}, NODES, "replicas"),
        ("swe-h800.yaml", {"agent": "coder", "replicas": {8: 1}, "tp": 8}, NODES, "plan"),
        ("swe-h800.yaml", {"agent": "coder", "replicas": {8: 600}}, NODES, f"{POOL0}.replicas"),
    ],
    ids=["tp-above-node-gpus", "unknown-agent", "ambiguous-accelerator", "no-pool-on-class", "tp-not-allowed",
         "negative-replicas", "non-integer-tp", "no-replicas", "unknown-key", "too-many-replicas"],
)  # fmt: skip
def test_bad_plans_name_the_field(
    example: str, plan: dict[str, Any], nodes: dict[str, int], field: str
) -> None:
    job = _job(example)
    before = copy.deepcopy(job)
    with pytest.raises(SpecError) as info:
        reshape.new_pools(job, reshape.parse_plan(plan), gpus_per_node=nodes)
    assert info.value.field == field, str(info.value)
    assert job == before  # nothing changed on the way
