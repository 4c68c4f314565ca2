"""The kopf settings the operator's behaviour depends on, checked through kopf's own storage code."""

from __future__ import annotations

from typing import Any

import kopf

from treadle.api import v1alpha1
from treadle.operator import config, handlers, metrics, runtime


def _settings() -> kopf.OperatorSettings:
    settings = kopf.OperatorSettings()
    memo = runtime.Runtime(
        kube=None,  # type: ignore[arg-type]  # configure() makes no API call
        cfg=config.OperatorConfig(),
        metrics=metrics.OperatorMetrics(),
        kubeconfig=None,
    )
    handlers.configure(settings=settings, memo=memo)
    return settings


def _job(annotations: dict[str, str]) -> kopf.Body:
    body: dict[str, Any] = {
        "apiVersion": v1alpha1.API_VERSION,
        "kind": v1alpha1.KIND,
        "metadata": {"name": "j", "namespace": "ns", "annotations": annotations},
        "spec": {"suspend": False},
    }
    return kopf.Body(body)


def test_reward_demand_is_part_of_the_diff_that_triggers_a_reconcile() -> None:
    """Regression: kopf drops every annotation under its storage prefix from the diff; with the
    prefix ``treadle.dev`` the scheduler's demand annotation never reached the update handler."""
    storage = _settings().persistence.diffbase_storage
    managed = f"{handlers.KOPF_PREFIX}/kopf-managed"  # what kopf stamps on every object it handles
    idle = storage.build(body=_job({managed: "yes", v1alpha1.REWARD_DEMAND_ANNOTATION: "0"}))
    busy = storage.build(body=_job({managed: "yes", v1alpha1.REWARD_DEMAND_ANNOTATION: "40"}))
    assert busy["metadata"]["annotations"] == {v1alpha1.REWARD_DEMAND_ANNOTATION: "40"}
    assert idle != busy


def test_kopf_bookkeeping_is_not_part_of_the_diff() -> None:
    storage = _settings().persistence.diffbase_storage
    prefix = handlers.KOPF_PREFIX
    essence = storage.build(body=_job({f"{prefix}/kopf-managed": "yes", f"{prefix}/reconcile": "{}"}))
    assert "metadata" not in essence
