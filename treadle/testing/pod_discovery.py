"""Kubernetes pod discovery for the Debian Prometheus, which is built without ``kubernetes_sd``.

Debian's ``prometheus`` 2.42 rejects ``kubernetes_sd_configs`` (its Kubernetes client libraries
are not packaged). This stands in for ``kubernetes_sd_configs: [{role: pod}]`` and nothing else:
an HTTP service discovery endpoint (``http_sd_configs``) answering, on every refresh, the targets
role ``pod`` makes of the pods ``list_pods`` returns now, with the same ``__meta_kubernetes_*``
labels (Prometheus' documentation of role ``pod``), so a scrape job's ``relabel_configs`` run
unchanged; a job's ``namespaces: {names: [...]}`` keeps only the pods of those namespaces, as
Prometheus does. Init containers and the node/controller labels are left out.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import re
import threading
import urllib.parse
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

META = "__meta_kubernetes_"
_UNSAFE = re.compile(r"[^a-zA-Z0-9_]")


def _sanitized(name: str) -> str:
    return _UNSAFE.sub("_", name)


def pod_targets(pods: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Role ``pod``'s target groups: a target per declared container port, one per container without
    any; pods without an IP yet are left out."""
    groups = []
    for pod in pods:
        ip = pod.get("status", {}).get("podIP")
        if not ip:
            continue
        meta, status = pod["metadata"], pod["status"]
        ready = any(c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions", []))
        common = {
            f"{META}namespace": meta["namespace"],
            f"{META}pod_name": meta["name"],
            f"{META}pod_ip": ip,
            f"{META}pod_uid": meta.get("uid", ""),
            f"{META}pod_phase": status.get("phase", ""),
            f"{META}pod_ready": str(ready).lower(),
            f"{META}pod_node_name": pod["spec"].get("nodeName", ""),
            f"{META}pod_host_ip": status.get("hostIP", ""),
        }
        for kind, values in (("label", meta.get("labels", {})), ("annotation", meta.get("annotations", {}))):
            for key, value in values.items():
                common[f"{META}pod_{kind}_{_sanitized(key)}"] = value
                common[f"{META}pod_{kind}present_{_sanitized(key)}"] = "true"
        for container in pod["spec"]["containers"]:
            labels = {**common, f"{META}pod_container_name": container["name"]}
            ports = container.get("ports") or [None]
            for port in ports:
                if port is None:
                    groups.append({"targets": [ip], "labels": labels})
                    continue
                groups.append({
                    "targets": [f"{ip}:{port['containerPort']}"],
                    "labels": {**labels, f"{META}pod_container_port_name": port.get("name", ""),
                               f"{META}pod_container_port_number": str(port["containerPort"]),
                               f"{META}pod_container_port_protocol": port.get("protocol", "TCP")},
                })  # fmt: skip
    return groups


@contextlib.contextmanager
def serving(list_pods: Callable[[], Sequence[Mapping[str, Any]]]) -> Iterator[str]:
    """An ``http_sd`` endpoint on 127.0.0.1 answering ``pod_targets(list_pods())``; yields its URL."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
            namespaces = set(query["namespaces"][0].split(",")) if "namespaces" in query else None
            pods = [p for p in list_pods() if namespaces is None or p["metadata"]["namespace"] in namespaces]
            body = json.dumps(pod_targets(pods)).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, name="pod-discovery", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/targets"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def with_pod_discovery(jobs: Sequence[Mapping[str, Any]], url: str, refresh: str) -> list[dict[str, Any]]:
    """Scrape jobs with each ``kubernetes_sd_configs: [{role: pod}]`` (optionally with ``namespaces:
    {names: [...]}``) replaced by ``url``'s ``http_sd``; any other Kubernetes discovery (another role,
    other selectors) is refused, not approximated."""
    out = []
    for job in jobs:
        job = dict(job)
        sd = job.pop("kubernetes_sd_configs", None)
        if sd is not None:
            names = _namespaces(str(job["job_name"]), sd)
            where = "" if names is None else "?namespaces=" + ",".join(names)
            job["http_sd_configs"] = [{"url": url + where, "refresh_interval": refresh}]
        out.append(job)
    return out


def _namespaces(job: str, sd: Any) -> list[str] | None:
    """The namespaces ``[{role: pod, namespaces: {names: [...]}}]`` keeps (None: every one)."""
    if isinstance(sd, list) and len(sd) == 1 and sd[0] == {"role": "pod"}:
        return None
    config = sd[0] if isinstance(sd, list) and len(sd) == 1 and isinstance(sd[0], dict) else {}
    names = config.get("namespaces", {}).get("names") if set(config) == {"role", "namespaces"} else None
    if config.get("role") == "pod" and names and config["namespaces"] == {"names": names}:
        return [str(n) for n in names]
    raise ValueError(
        f"{job}: only kubernetes_sd role pod (optionally by namespace names) is emulated, not {sd}"
    )
