"""The few Kubernetes API calls the operator makes, over the official client, with raw JSON dicts.

Called by ``treadle.operator.handlers`` (from kopf's bounded thread pool) and by the benchmark.
Children are written with server-side apply under one field manager, so re-applying an unchanged
object is a no-op on the server and a user's own fields (e.g. an HPA-managed replica count on a
different manager) are not clobbered beyond what Treadle renders.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import kubernetes

from treadle import kubeapi
from treadle.api import nodes
from treadle.operator import status
from treadle.operator.render import common as render_common

# Collection path of each child kind (namespaced).
COLLECTIONS: Mapping[str, str] = {
    "ConfigMap": "/api/v1/namespaces/{ns}/configmaps",
    "Service": "/api/v1/namespaces/{ns}/services",
    "Deployment": "/apis/apps/v1/namespaces/{ns}/deployments",
    "ServiceAccount": "/api/v1/namespaces/{ns}/serviceaccounts",
    "Role": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles",
    "RoleBinding": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings",
    "Job": "/apis/batch/v1/namespaces/{ns}/jobs",
    "Secret": "/api/v1/namespaces/{ns}/secrets",
    "NetworkPolicy": "/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies",
}


class Kube(kubeapi.Client):
    """The shared client plus the operator's calls: children, job status and Events."""

    def apply(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Server-side apply one child (create or update), taking ownership of the rendered fields."""
        meta = obj["metadata"]
        path = COLLECTIONS[obj["kind"]].format(ns=meta["namespace"]) + "/" + meta["name"]
        out: dict[str, Any] = self._call(
            "PATCH",
            path,
            query=[("fieldManager", render_common.FIELD_MANAGER), ("force", "true")],
            body=obj,
            content_type="application/apply-patch+yaml",  # JSON is YAML
        )
        return out

    def delete(self, kind: str, namespace: str, name: str) -> None:
        path = COLLECTIONS[kind].format(ns=namespace) + "/" + name
        try:
            self._call("DELETE", path, body={"propagationPolicy": "Background"})
        except kubernetes.client.ApiException as exc:
            if exc.status != 404:
                raise

    def list_children(self, namespace: str, job: str, uid: str) -> dict[tuple[str, str], dict[str, Any]]:
        """Every child of the job that this job (by uid) controls, keyed by (kind, name)."""
        out: dict[tuple[str, str], dict[str, Any]] = {}
        for kind, collection in COLLECTIONS.items():
            listed = self._call(
                "GET",
                collection.format(ns=namespace),
                query=[("labelSelector", f"{render_common.JOB_LABEL}={job}")],
            )
            for item in listed.get("items", []):
                owners = item.get("metadata", {}).get("ownerReferences", [])
                # A same-named job deleted and recreated leaves children of the old uid to the GC.
                if any(o.get("uid") == uid and o.get("controller") for o in owners):
                    item.setdefault("kind", kind)
                    out[(kind, item["metadata"]["name"])] = item
        return out

    def gpu_capacity(self) -> dict[str, int]:
        """Allocatable GPUs per accelerator class over schedulable labelled nodes (one list call)."""
        listed = self._call("GET", "/api/v1/nodes", query=[("labelSelector", nodes.ACCELERATOR_LABEL)])
        out: dict[str, int] = {}
        for node in listed.get("items", []):
            if found := status.node_gpus(node, nodes.ACCELERATOR_LABEL, nodes.GPU_RESOURCE):
                out[found[0]] = out.get(found[0], 0) + found[1]
        return out

    def job_uid(self, namespace: str, name: str) -> str | None:
        """The uid of the job now on the server, None if it is gone (a list call: the operator's
        RBAC has list, not get, on RolloutJobs)."""
        query = [("fieldSelector", f"metadata.name={name}")]
        items = self._call("GET", kubeapi.JOBS_PATH.format(ns=namespace), query=query).get("items", [])
        return str(items[0]["metadata"]["uid"]) if items else None

    def get_job(self, namespace: str, name: str) -> dict[str, Any]:
        out: dict[str, Any] = self._call("GET", kubeapi.JOBS_PATH.format(ns=namespace) + f"/{name}")
        return out

    def patch_job(self, namespace: str, name: str, ops: list[dict[str, Any]]) -> dict[str, Any]:
        """JSON-patch the job (``test`` operations make it fail with 422 if the job moved on)."""
        path = kubeapi.JOBS_PATH.format(ns=namespace) + f"/{name}"
        out: dict[str, Any] = self._call("PATCH", path, body=ops, content_type="application/json-patch+json")
        return out

    def gpus_per_node(self) -> dict[str, int]:
        """The most allocatable GPUs on one schedulable node, per accelerator class (the TP ceiling)."""
        listed = self._call("GET", "/api/v1/nodes", query=[("labelSelector", nodes.ACCELERATOR_LABEL)])
        out: dict[str, int] = {}
        for node in listed.get("items", []):
            if found := status.node_gpus(node, nodes.ACCELERATOR_LABEL, nodes.GPU_RESOURCE):
                out[found[0]] = max(out.get(found[0], 0), found[1])
        return out
