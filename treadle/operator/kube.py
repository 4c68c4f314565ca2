"""The few Kubernetes API calls the operator makes, over the official client, with raw JSON dicts.

Called by ``treadle.operator.handlers`` (from kopf's bounded thread pool) and by the benchmark.
Children are written with server-side apply under one field manager, so re-applying an unchanged
object is a no-op on the server and a user's own fields (e.g. an HPA-managed replica count on a
different manager) are not clobbered beyond what Treadle renders.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import kubernetes

from treadle.api import v1alpha1
from treadle.devcluster import nodes
from treadle.operator import render, status

# Collection path of each child kind (namespaced).
COLLECTIONS: Mapping[str, str] = {
    "ConfigMap": "/api/v1/namespaces/{ns}/configmaps",
    "Service": "/api/v1/namespaces/{ns}/services",
    "Deployment": "/apis/apps/v1/namespaces/{ns}/deployments",
    "ServiceAccount": "/api/v1/namespaces/{ns}/serviceaccounts",
    "Role": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles",
    "RoleBinding": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings",
}
JOBS_PATH = f"/apis/{v1alpha1.GROUP}/{v1alpha1.VERSION}/namespaces/{{ns}}/{v1alpha1.PLURAL}"
TIMEOUT = (5.0, 30.0)  # connect, read (seconds): a hung call must not hold a worker thread forever


def load_configuration(
    kubeconfig: str | None = None, *, environ: Mapping[str, str] | None = None
) -> kubernetes.client.Configuration:
    """Fresh credentials: in-cluster in a pod (unless a kubeconfig is given), else the kubeconfig.

    Read anew on every call, so a re-login picks up a rotated ServiceAccount token. ``environ``
    (default ``os.environ``) decides which: ``KUBERNETES_SERVICE_HOST`` / ``KUBECONFIG``. Raises
    ``kubernetes.config.ConfigException`` (or ``OSError``) when there are no credentials.
    """
    env = os.environ if environ is None else environ
    configuration = kubernetes.client.Configuration()
    if kubeconfig is None and env.get("KUBERNETES_SERVICE_HOST"):
        kubernetes.config.incluster_config.InClusterConfigLoader(  # type: ignore[no-untyped-call]
            token_filename=kubernetes.config.incluster_config.SERVICE_TOKEN_FILENAME,
            cert_filename=kubernetes.config.incluster_config.SERVICE_CERT_FILENAME,
            try_refresh_token=True,
            environ=env,
        ).load_and_set(configuration)
    else:
        # Pass the path explicitly: the client reads $KUBECONFIG only once, at import time.
        path = kubeconfig or env.get("KUBECONFIG") or None
        kubernetes.config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=path, client_configuration=configuration
        )
    return configuration


class Kube:
    """A thread-safe client for children, job status and Events."""

    def __init__(self, api: kubernetes.client.ApiClient) -> None:
        self.api = api

    @classmethod
    def from_environment(
        cls, kubeconfig: str | None = None, *, pool_size: int = 16, environ: Mapping[str, str] | None = None
    ) -> Kube:
        """In-cluster credentials when running in a pod, else ``kubeconfig`` / ``$KUBECONFIG``."""
        configuration = load_configuration(kubeconfig, environ=environ)
        # One connection per worker thread, so calls never queue on the pool.
        configuration.connection_pool_maxsize = pool_size
        return cls(kubernetes.client.ApiClient(configuration))

    def _call(
        self,
        method: str,
        path: str,
        *,
        query: list[tuple[str, str]] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> Any:
        """One request; the JSON reply as plain dicts; ``ApiException`` on any non-2xx status."""
        _, url, headers, data, _ = self.api.param_serialize(
            method=method,
            resource_path=path,
            query_params=query or [],
            header_params={"Accept": "application/json", "Content-Type": content_type},
            body=body,  # serialized as JSON, which is also valid for apply-patch+yaml
            auth_settings=["BearerToken"],
        )
        response = self.api.call_api(method, url, header_params=headers, body=data, _request_timeout=TIMEOUT)
        response.read()  # type: ignore[no-untyped-call]
        if not 200 <= response.status < 300:
            raise kubernetes.client.ApiException(http_resp=response)
        return json.loads(response.data) if response.data else None

    def apply(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Server-side apply one child (create or update), taking ownership of the rendered fields."""
        meta = obj["metadata"]
        path = COLLECTIONS[obj["kind"]].format(ns=meta["namespace"]) + "/" + meta["name"]
        out: dict[str, Any] = self._call(
            "PATCH",
            path,
            query=[("fieldManager", render.FIELD_MANAGER), ("force", "true")],
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
                "GET", collection.format(ns=namespace), query=[("labelSelector", f"{render.JOB_LABEL}={job}")]
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

    def patch_status(self, namespace: str, name: str, status: Mapping[str, Any], *, uid: str | None) -> None:
        """Merge-patch the job's status; with ``uid``, a job re-created under the name gets 409."""
        path = JOBS_PATH.format(ns=namespace) + f"/{name}/status"
        body: dict[str, Any] = {"status": status}
        if uid:
            body["metadata"] = {"uid": uid}  # the API server treats it as a precondition
        self._call("PATCH", path, body=body, content_type="application/merge-patch+json")

    def job_uid(self, namespace: str, name: str) -> str | None:
        """The uid of the job now on the server, None if it is gone (a list call: the operator's
        RBAC has list, not get, on RolloutJobs)."""
        query = [("fieldSelector", f"metadata.name={name}")]
        items = self._call("GET", JOBS_PATH.format(ns=namespace), query=query).get("items", [])
        return str(items[0]["metadata"]["uid"]) if items else None

    def get_job(self, namespace: str, name: str) -> dict[str, Any]:
        out: dict[str, Any] = self._call("GET", JOBS_PATH.format(ns=namespace) + f"/{name}")
        return out

    def patch_job(self, namespace: str, name: str, ops: list[dict[str, Any]]) -> dict[str, Any]:
        """JSON-patch the job (``test`` operations make it fail with 422 if the job moved on)."""
        path = JOBS_PATH.format(ns=namespace) + f"/{name}"
        out: dict[str, Any] = self._call("PATCH", path, body=ops, content_type="application/json-patch+json")
        return out

    def annotate_job(self, namespace: str, name: str, annotations: Mapping[str, str]) -> None:
        """Merge-patch annotations onto the job (the only write the scheduler's Role allows)."""
        path = JOBS_PATH.format(ns=namespace) + f"/{name}"
        body = {"metadata": {"annotations": dict(annotations)}}
        self._call("PATCH", path, body=body, content_type="application/merge-patch+json")

    def gpus_per_node(self) -> dict[str, int]:
        """The most allocatable GPUs on one schedulable node, per accelerator class (the TP ceiling)."""
        listed = self._call("GET", "/api/v1/nodes", query=[("labelSelector", nodes.ACCELERATOR_LABEL)])
        out: dict[str, int] = {}
        for node in listed.get("items", []):
            if found := status.node_gpus(node, nodes.ACCELERATOR_LABEL, nodes.GPU_RESOURCE):
                out[found[0]] = max(out.get(found[0], 0), found[1])
        return out

    def close(self) -> None:
        self.api.close()  # type: ignore[no-untyped-call]
