"""Read a RolloutJob and what ``treadle status`` explains about it from the API server.

The thin I/O half of ``treadle status`` (``treadle.operator.explain`` is the pure half): five list
or get calls with the caller's own credentials, none of them a write.
"""

from __future__ import annotations

import kubernetes

from treadle.operator import explain, kube
from treadle.operator.render import common as render_common

DEPLOYMENTS = "/apis/apps/v1/namespaces/{ns}/deployments"
PODS = "/api/v1/namespaces/{ns}/pods"
EVENTS = "/api/v1/namespaces/{ns}/events"


class NotFoundError(LookupError):
    """The job does not exist (the message names it)."""


class Reader(kube.Kube):
    """The operator's client, used read-only."""

    def snapshot(self, namespace: str, name: str) -> explain.Snapshot:
        try:
            job = self.get_job(namespace, name)
        except kubernetes.client.ApiException as exc:
            if exc.status == 404:
                raise NotFoundError(f"RolloutJob {namespace}/{name} not found") from exc
            raise
        selector = [("labelSelector", f"{render_common.JOB_LABEL}={name}")]
        deployments = self._call("GET", DEPLOYMENTS.format(ns=namespace), query=selector)["items"]
        pods = self._call("GET", PODS.format(ns=namespace), query=selector)["items"]
        # The scheduler's own reason for each pending pod (node counts, taints, resources).
        failed = [("fieldSelector", "reason=FailedScheduling")]
        events = self._call("GET", EVENTS.format(ns=namespace), query=failed)["items"]
        try:
            capacity: dict[str, int] | None = self.gpu_capacity()
        except kubernetes.client.ApiException as exc:
            if exc.status != 403:
                raise
            capacity = None  # a user who may not list nodes still gets everything else
        return explain.Snapshot(
            job=job, deployments=deployments, pods=pods, events=events, gpu_capacity=capacity
        )
