"""The reconciler applies only children whose rendering changed and deletes the ones no longer rendered."""

from __future__ import annotations

from typing import Any

from treadle.api import v1alpha1
from treadle.operator import config, diff, render
from treadle.operator.render import common as render_common

CFG = config.OperatorConfig()


def _observed(children: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {render_common.key(c): c for c in children}


def test_nothing_observed_applies_everything(math_job: v1alpha1.RolloutJob) -> None:
    rendered = render.render_children(math_job, CFG)
    plan = diff.plan(rendered, {})
    assert [render_common.key(c) for c in plan.apply] == [render_common.key(c) for c in rendered]
    assert plan.delete == () and plan.unchanged == 0


def test_same_render_is_a_no_op(math_job: v1alpha1.RolloutJob) -> None:
    rendered = render.render_children(math_job, CFG)
    plan = diff.plan(rendered, _observed(rendered))
    assert plan.empty and plan.unchanged == len(rendered)


def test_scaling_a_pool_applies_that_pool_and_config_only(math_job: v1alpha1.RolloutJob) -> None:
    observed = _observed(render.render_children(math_job, CFG))
    pool = math_job.spec.pools[0].model_copy(update={"replicas": 1})
    job = math_job.model_copy(update={"spec": math_job.spec.model_copy(update={"pools": [pool]})})
    plan = diff.plan(render.render_children(job, CFG), observed)
    assert sorted(render_common.key(c) for c in plan.apply) == [
        ("ConfigMap", "math-tool-config"),
        ("Deployment", "math-tool-pool-decode"),
    ]


def test_removed_pool_is_deleted(math_job: v1alpha1.RolloutJob) -> None:
    extra = v1alpha1.Pool(name="old", agent="solver", accelerator="H800")
    bigger = math_job.model_copy(
        update={"spec": math_job.spec.model_copy(update={"pools": [*math_job.spec.pools, extra]})}
    )
    plan = diff.plan(render.render_children(math_job, CFG), _observed(render.render_children(bigger, CFG)))
    assert plan.delete == (("Deployment", "math-tool-pool-old"), ("Service", "math-tool-pool-old"))


def test_hand_edited_child_is_restored(math_job: v1alpha1.RolloutJob) -> None:
    rendered = render.render_children(math_job, CFG)
    observed = _observed(rendered)
    tampered = dict(observed[("Service", "math-tool-env")])
    tampered["metadata"] = {**tampered["metadata"], "annotations": {render_common.HASH_ANNOTATION: "edited"}}
    observed[("Service", "math-tool-env")] = tampered
    plan = diff.plan(rendered, observed)
    assert [render_common.key(c) for c in plan.apply] == [("Service", "math-tool-env")]
