"""The API calls a node agent makes, as a kubelet would: its Node and Lease, its pods, their inputs."""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any

import kubernetes
import urllib3

from treadle import kubeapi

LEASE_NAMESPACE = "kube-node-lease"
ERRORS = (kubernetes.client.ApiException, urllib3.exceptions.HTTPError, OSError)
"""What a call may raise when the API server refuses, fails or cannot be reached."""


def now() -> str:
    """The API's timestamp format (RFC 3339, seconds)."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def now_micro() -> str:
    """MicroTime, as Lease.spec.renewTime wants it."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class NodeClient(kubeapi.Client):
    """The shared client plus the node agent's calls."""

    def _get_or_none(self, path: str) -> dict[str, Any] | None:
        try:
            out: dict[str, Any] = self._call("GET", path)
        except kubernetes.client.ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return out

    def register_node(self, node: Mapping[str, Any]) -> None:
        """Create the Node, or replace labels, taints and status of one this agent made before."""
        name = node["metadata"]["name"]
        if self._get_or_none(f"/api/v1/nodes/{name}") is None:
            self._call("POST", "/api/v1/nodes", body=node)
        else:
            patch = {"metadata": {"labels": node["metadata"]["labels"],
                                  "annotations": node["metadata"]["annotations"]},
                     "spec": node["spec"]}  # fmt: skip
            self._call(
                "PATCH", f"/api/v1/nodes/{name}", body=patch, content_type="application/merge-patch+json"
            )
        self.patch_node_status(name, node["status"])

    def patch_node_status(self, name: str, status: Mapping[str, Any]) -> None:
        self._call("PATCH", f"/api/v1/nodes/{name}/status", body={"status": status},
                   content_type="application/merge-patch+json")  # fmt: skip

    def renew_lease(self, node: str, node_uid: str, duration_s: int) -> None:
        """Create or renew ``kube-node-lease/<node>``: the node controller's heartbeat."""
        path = f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases"
        spec = {"holderIdentity": node, "leaseDurationSeconds": duration_s, "renewTime": now_micro()}
        if self._get_or_none(f"{path}/{node}") is None:
            owner = {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid}
            body = {"metadata": {"name": node, "namespace": LEASE_NAMESPACE, "ownerReferences": [owner]},
                    "spec": spec}  # fmt: skip
            self._call("POST", path, body=body)
        else:
            self._call(
                "PATCH", f"{path}/{node}", body={"spec": spec}, content_type="application/merge-patch+json"
            )

    def node_uid(self, name: str) -> str:
        return str(self._call("GET", f"/api/v1/nodes/{name}")["metadata"]["uid"])

    def pods_on(self, node: str) -> list[dict[str, Any]]:
        query = [("fieldSelector", f"spec.nodeName={node}")]
        items: list[dict[str, Any]] = self._call("GET", "/api/v1/pods", query=query).get("items", [])
        return items

    def get(self, path: str) -> dict[str, Any] | None:
        """Any object by path; None when it does not exist."""
        return self._get_or_none(path)

    def list(self, path: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self._call("GET", path).get("items", [])
        return items

    def request_token(
        self, namespace: str, account: str, pod: Mapping[str, Any], seconds: int, audience: str | None
    ) -> str:
        """A ServiceAccount token bound to the pod (TokenRequest), as the kubelet projects it."""
        spec: dict[str, Any] = {
            "expirationSeconds": seconds,
            "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": pod["metadata"]["name"],
                               "uid": pod["metadata"]["uid"]},
        }  # fmt: skip
        if audience:
            spec["audiences"] = [audience]
        path = f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token"
        out = self._call("POST", path, body={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                                             "spec": spec})  # fmt: skip
        return str(out["status"]["token"])

    def patch_pod_status(self, namespace: str, name: str, uid: str, status: Mapping[str, Any]) -> None:
        body = {"metadata": {"uid": uid}, "status": status}  # uid: a re-created namesake gets 409
        self._call("PATCH", f"/api/v1/namespaces/{namespace}/pods/{name}/status", body=body,
                   content_type="application/merge-patch+json")  # fmt: skip

    def delete_pod_now(self, namespace: str, name: str, uid: str) -> None:
        """Remove the pod object once its containers are gone (grace 0, as the kubelet does)."""
        body = {"gracePeriodSeconds": 0, "preconditions": {"uid": uid}}
        try:
            self._call("DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}", body=body)
        except kubernetes.client.ApiException as exc:
            if exc.status not in (404, 409):
                raise

    def post_event(self, pod: Mapping[str, Any], reason: str, message: str, kind: str = "Normal") -> None:
        meta = pod["metadata"]
        ns = meta["namespace"]
        stamp = now()
        event = {
            "metadata": {"generateName": f"{meta['name']}.", "namespace": ns},
            "involvedObject": {"kind": "Pod", "namespace": ns, "name": meta["name"], "uid": meta["uid"],
                               "apiVersion": "v1"},
            "reason": reason, "message": message, "type": kind,
            "source": {"component": "treadle-node-agent", "host": pod["spec"].get("nodeName", "")},
            "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1,
        }  # fmt: skip
        self._call("POST", f"/api/v1/namespaces/{ns}/events", body=event)
