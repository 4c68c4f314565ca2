"""Apply a Heddle TP plan to a RolloutJob: ``PoolReshape`` -> the job's new ``spec.pools``, as a patch.

Pure; called by ``treadle operator reshape`` (``treadle.operator.cli``), which reads the job and
the nodes, writes the JSON patch this module returns, and leaves the rest to the normal reconcile:
only the Deployments of pools whose replicas or ``tensorParallelSize`` changed are re-applied
(their pods re-created with the new ``nvidia.com/gpu`` count), plus the job's ConfigMap.

The plan (``treadle.policy.heddle.tp_planner``) says how many replicas of each TP degree one
agent's GPUs on one accelerator class should hold. Mapping it onto named pools:

1. ``tp_planner.pools_after``: a pool whose degree is in the plan takes that many replicas; a pool
   whose degree is not is drained to 0; a planned degree no pool has becomes ``<first>-tp<g>``.
2. Ours: a drained pool takes over a new degree in place (its name, and the tasks that route to
   it, stay; only its TP and replicas change) instead of a new pool appearing beside an empty one.
   Pools left drained stay at 0 replicas under their names, for the same reason.

New pools copy the first matching pool (agent, accelerator, node selector, tolerations, preferred
work). Every changed pool must fit on one node: TP <= the most GPUs any node of its class has.
The patch ``test``s the pools it read, so a concurrent edit makes it fail instead of being lost.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from treadle.api import v1alpha1
from treadle.errors import SpecError
from treadle.policy.heddle import tp_planner


@dataclass(frozen=True)
class PlanFile:
    """What ``--plan FILE`` holds: one agent's reshape on one accelerator class."""

    agent: str
    accelerator: str | None
    """None: the agent's pools share one class."""
    reshape: tp_planner.PoolReshape


def parse_plan(doc: Any) -> PlanFile:
    """``{agent, accelerator?, replicas: {tp: replicas}}`` (YAML or JSON; keys may be strings)."""
    if not isinstance(doc, Mapping):
        raise SpecError("expected a mapping with agent and replicas", field="plan", value=doc)
    unknown = sorted(set(doc) - {"agent", "accelerator", "replicas"})
    if unknown:
        raise SpecError(f"unknown keys {unknown}", field="plan", value=unknown)
    agent = doc.get("agent")
    if not isinstance(agent, str) or not agent:
        raise SpecError("expected the agent's name", field="agent", value=agent)
    accelerator = doc.get("accelerator")
    if accelerator is not None and not isinstance(accelerator, str):
        raise SpecError("expected an accelerator class such as H800", field="accelerator", value=accelerator)
    raw = doc.get("replicas")
    if not isinstance(raw, Mapping) or not raw:
        raise SpecError("expected a mapping TP degree -> replicas", field="replicas", value=raw)
    counts: dict[int, int] = {}
    for key, value in raw.items():
        tp = int(key) if isinstance(key, int) or (isinstance(key, str) and key.isdigit()) else 0
        if tp < 1:
            raise SpecError("TP degrees are positive integers", field=f"replicas.{key}", value=key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise SpecError("expected replicas >= 0", field=f"replicas.{key}", value=value)
        counts[tp] = value
    reshape = tp_planner.PoolReshape(replicas=tuple(sorted(counts.items(), reverse=True)))
    return PlanFile(agent=agent, accelerator=accelerator, reshape=reshape)


def new_pools(
    job: Mapping[str, Any], plan: PlanFile, *, gpus_per_node: Mapping[str, int]
) -> list[dict[str, Any]]:
    """The job's ``spec.pools`` (as stored, camelCase) with ``plan`` applied; other pools untouched."""
    parsed = v1alpha1.parse_job(job)
    pools: list[dict[str, Any]] = copy.deepcopy(list(job["spec"]["pools"]))
    mine = [i for i, p in enumerate(parsed.spec.pools) if p.agent == plan.agent]
    if not mine:
        raise SpecError(f"no pool serves agent {plan.agent!r}", field="agent", value=plan.agent)
    classes = sorted({parsed.spec.pools[i].accelerator for i in mine})
    if plan.accelerator is None and len(classes) > 1:
        raise SpecError(f"agent {plan.agent!r} has pools on {classes}: name one", field="accelerator")
    accelerator = plan.accelerator or classes[0]
    mine = [i for i in mine if parsed.spec.pools[i].accelerator == accelerator]
    if not mine:
        raise SpecError(
            f"agent {plan.agent!r} has no {accelerator} pool", field="accelerator", value=accelerator
        )
    seen: dict[int, int] = {}
    for i in mine:
        tp = parsed.spec.pools[i].tensor_parallel_size
        if tp in seen:
            raise SpecError(f"pools {seen[tp]} and {i} both have TP {tp}: the plan cannot tell them apart",
                            field=f"spec.pools[{i}].tensorParallelSize", value=tp)  # fmt: skip
        seen[tp] = i
    shapes = [
        tp_planner.PoolShape(name=p.name, tp=p.tensor_parallel_size, replicas=p.replicas)
        for p in (parsed.spec.pools[i] for i in mine)
    ]
    first = parsed.spec.pools[mine[0]].name
    try:
        after = tp_planner.pools_after(shapes, plan.reshape, base_name=first)
    except SpecError as exc:  # the only name it makes is ``<first>-tp<g>``
        raise SpecError(str(exc), field=f"spec.pools[{mine[0]}].name", value=first) from exc
    index = {parsed.spec.pools[i].name: i for i in mine}
    planned = dict(plan.reshape.replicas)
    drained = [s for s in after if s.name in index and s.tp not in planned]
    fresh = [s for s in after if s.name not in index]
    for shape in after:
        if shape.name in index:
            pools[index[shape.name]]["replicas"] = shape.replicas
    for old, new in zip(drained, fresh, strict=False):  # reuse a drained pool's name in place
        pools[index[old.name]] |= {"tensorParallelSize": new.tp, "replicas": new.replicas}
    template = job["spec"]["pools"][mine[0]]
    for new in fresh[len(drained) :]:
        pools.append({**copy.deepcopy(template), "name": new.name, "tensorParallelSize": new.tp,
                      "replicas": new.replicas})  # fmt: skip
    limit = gpus_per_node.get(accelerator, 0)
    for i, pool in enumerate(pools):
        gpus = int(pool.get("tensorParallelSize", 1))
        ours = pool.get("agent") == plan.agent and pool.get("accelerator") == accelerator
        if ours and int(pool.get("replicas", 1)) > 0 and gpus > limit:
            raise SpecError(
                f"{gpus} GPUs per replica, but no schedulable {accelerator} node has more than {limit}",
                field=f"spec.pools[{i}].tensorParallelSize",
                value=gpus,
            )
    v1alpha1.parse_job({**job, "spec": {**job["spec"], "pools": pools}})  # names the field if invalid
    return pools


def json_patch(job: Mapping[str, Any], pools: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Replace ``spec.pools`` only if they are still what was read."""
    return [
        {"op": "test", "path": "/spec/pools", "value": job["spec"]["pools"]},
        {"op": "replace", "path": "/spec/pools", "value": list(pools)},
    ]


def describe(before: Sequence[Mapping[str, Any]], after: Sequence[Mapping[str, Any]]) -> list[str]:
    """One line per pool that changes: ``name: replicas x TP -> replicas x TP``."""
    old = {p["name"]: p for p in before}

    def shape(p: Mapping[str, Any] | None) -> str:
        return "-" if p is None else f"{p.get('replicas', 1)} x TP{p.get('tensorParallelSize', 1)}"

    return [
        f"{p['name']}: {shape(old.get(p['name']))} -> {shape(p)}"
        for p in after
        if shape(old.get(p["name"])) != shape(p)
    ]
