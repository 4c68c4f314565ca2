"""A reconcile handed a body of a job that is gone (kopf's queued older events) applies nothing."""

from __future__ import annotations

import logging
from typing import Any

import kopf
import operator_examples
import pytest
import yaml

from treadle.operator import config, handlers, metrics, runtime


class GoneJobKube:
    """The job is no longer on the server (or has another uid); nothing else may be called."""

    def __init__(self, uid: str | None) -> None:
        self.uid = uid

    def job_uid(self, namespace: str, name: str) -> str | None:
        return self.uid

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"reconcile of a gone job called Kube.{name}")


@pytest.mark.parametrize("server_uid", [None, "uid-of-a-new-job"], ids=["deleted", "re-created"])
def test_reconcile_of_a_gone_job_applies_nothing(server_uid: str | None) -> None:
    doc = yaml.safe_load(
        (operator_examples.ROOT / "manifests" / "examples" / "math-tool-h20.yaml").read_text()
    )
    doc["metadata"] |= {"namespace": "team-a", "uid": "uid-of-the-deleted-job", "generation": 1}
    memo = runtime.Runtime(
        kube=GoneJobKube(server_uid),  # type: ignore[arg-type]
        cfg=config.OperatorConfig(),
        metrics=metrics.OperatorMetrics(),
        kubeconfig=None,
    )
    handlers.reconcile(body=kopf.Body(doc), memo=memo, logger=logging.getLogger("test"))
    assert memo.reconciling == set()
