"""What a pod's containers see besides their argv: volumes as directories, and the environment.

Volumes live under the pod's directory on the host and are bind-mounted by ``launch`` at each
volumeMount's path. ``emptyDir`` is a directory (``medium: Memory`` too: the pod's directory, not a
tmpfs); ``configMap``, ``secret``, ``downwardAPI`` and ``projected`` (ServiceAccount token by
TokenRequest, ``kube-root-ca.crt``, the namespace) are files written from the API objects and
rewritten on each refresh; ``hostPath`` is the host path itself. Other volume types (PVCs, CSI) are
refused with a message naming the volume: the pod stays ``ContainerCreating`` and says why.

Environment: ``value``, ``valueFrom`` (``fieldRef``, ``resourceFieldRef``, ``configMapKeyRef``,
``secretKeyRef``), ``envFrom``, with ``$(VAR)`` expanded as the kubelet does.
"""

from __future__ import annotations

import base64
import os
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import kubernetes

from treadle.devcluster.nodeagent import kube

TOKEN_SECONDS = 3607  # what the ServiceAccount admission plugin asks for
TOKEN_RENEW_AT = 0.8  # of the token's lifetime, as the kubelet renews


class InputError(RuntimeError):
    """A volume or an env var cannot be made; the message names it. The agent retries."""


def _write_files(directory: Path, files: Mapping[str, bytes], mode: int) -> None:
    """Write every file (relative paths), each atomically (temp + rename), and drop files no longer listed."""
    directory.mkdir(parents=True, exist_ok=True)
    for rel, content in files.items():
        target = directory / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp")
        tmp.write_bytes(content)
        tmp.chmod(mode)
        os.replace(tmp, target)
    for path in directory.rglob("*"):
        if path.is_file() and str(path.relative_to(directory)) not in files:
            path.unlink()


def _keyed(data: Mapping[str, bytes], items: list[dict[str, Any]] | None, what: str) -> dict[str, bytes]:
    if not items:
        return dict(data)
    out = {}
    for item in items:
        if item["key"] not in data:
            raise InputError(f"{what}: no key {item['key']!r}")
        out[item["path"]] = data[item["key"]]
    return out


def field_value(pod: Mapping[str, Any], path: str) -> str:
    """A downward-API ``fieldPath`` of the pod (``metadata.name``, ``status.podIP``, ...)."""
    meta, spec, status = pod["metadata"], pod["spec"], pod.get("status", {})
    if m := re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path):
        return str(meta.get(m.group(1), {}).get(m.group(2), ""))
    simple = {
        "metadata.name": meta["name"], "metadata.namespace": meta["namespace"], "metadata.uid": meta["uid"],
        "spec.nodeName": spec.get("nodeName", ""),
        "spec.serviceAccountName": spec.get("serviceAccountName", ""),
        "status.podIP": status.get("podIP", ""), "status.hostIP": status.get("hostIP", ""),
    }  # fmt: skip
    if path not in simple:
        raise InputError(f"fieldRef.fieldPath {path!r} is not supported by the node agent")
    return str(simple[path])


class Inputs:
    """Reads a pod's ConfigMaps, Secrets and tokens through the API and materializes them."""

    def __init__(self, client: kube.NodeClient, pod: Mapping[str, Any], pod_dir: Path) -> None:
        self.client = client
        self.pod = pod
        self.ns = pod["metadata"]["namespace"]
        self.pod_dir = pod_dir
        self.tokens: dict[tuple[str, str | None, int], tuple[str, float]] = {}  # -> (token, renew at)

    def _object_data(self, kind: str, name: str, optional: bool) -> dict[str, bytes] | None:
        plural = "configmaps" if kind == "configMap" else "secrets"
        obj = self.client.get(f"/api/v1/namespaces/{self.ns}/{plural}/{name}")
        if obj is None:
            if optional:
                return None
            raise InputError(f"{kind} {self.ns}/{name} not found")
        if kind == "configMap":
            data = {k: v.encode() for k, v in (obj.get("data") or {}).items()}
            data |= {k: base64.b64decode(v) for k, v in (obj.get("binaryData") or {}).items()}
        else:
            data = {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}
        return data

    def volume_dir(self, name: str) -> Path:
        return self.pod_dir / "volumes" / name

    def refresh_volumes(self) -> dict[str, Path]:
        """Make or refresh every volume; volume name -> host path to bind-mount."""
        out: dict[str, Path] = {}
        for vol in self.pod["spec"].get("volumes", []):
            try:
                out[vol["name"]] = self._volume(vol)
            except kubernetes.client.ApiException as exc:
                raise InputError(f"volume {vol['name']!r}: API error {exc.status} {exc.reason}") from exc
        return out

    def _volume(self, vol: Mapping[str, Any]) -> Path:
        name, where = vol["name"], self.volume_dir(vol["name"])
        if "emptyDir" in vol:
            where.mkdir(parents=True, exist_ok=True)
            return where
        if "hostPath" in vol:
            path = Path(vol["hostPath"]["path"])
            kind = vol["hostPath"].get("type", "")
            if kind == "DirectoryOrCreate":
                path.mkdir(parents=True, exist_ok=True)
            elif kind in ("Directory", "File") and not path.exists():
                raise InputError(f"volume {name!r}: hostPath {path} does not exist")
            return path
        for kind in ("configMap", "secret"):
            if kind in vol:
                src = vol[kind]
                obj_name = src["name"] if kind == "configMap" else src["secretName"]
                data = self._object_data(kind, obj_name, bool(src.get("optional")))
                files = _keyed(data or {}, src.get("items"), f"volume {name!r}")
                _write_files(where, files, src.get("defaultMode", 0o644))
                return where
        if "downwardAPI" in vol:
            spec = vol["downwardAPI"]
            files = {
                i["path"]: field_value(self.pod, i["fieldRef"]["fieldPath"]).encode() for i in spec["items"]
            }
            _write_files(where, files, spec.get("defaultMode", 0o644))
            return where
        if "projected" in vol:
            files = {}
            for source in vol["projected"].get("sources", []):
                files |= self._projected(source, name)
            _write_files(where, files, vol["projected"].get("defaultMode", 0o644))
            return where
        kinds = sorted(set(vol) - {"name"})
        raise InputError(f"volume {name!r}: type {kinds} is not supported by the node agent")

    def _projected(self, source: Mapping[str, Any], name: str) -> dict[str, bytes]:
        if (token := source.get("serviceAccountToken")) is not None:
            account = self.pod["spec"].get("serviceAccountName") or "default"
            seconds = int(token.get("expirationSeconds", TOKEN_SECONDS))
            key = (account, token.get("audience"), seconds)
            value, renew_at = self.tokens.get(key, ("", 0.0))
            if time.monotonic() >= renew_at:
                value = self.client.request_token(self.ns, account, self.pod, seconds, token.get("audience"))
                self.tokens[key] = (value, time.monotonic() + TOKEN_RENEW_AT * seconds)
            return {token["path"]: value.encode()}
        for kind in ("configMap", "secret"):
            if (src := source.get(kind)) is not None:
                data = self._object_data(kind, src["name"], bool(src.get("optional")))
                return _keyed(data or {}, src.get("items"), f"volume {name!r}")
        if (down := source.get("downwardAPI")) is not None:
            return {
                i["path"]: field_value(self.pod, i["fieldRef"]["fieldPath"]).encode() for i in down["items"]
            }
        raise InputError(f"volume {name!r}: projected source {sorted(source)} is not supported")

    def env(self, container: Mapping[str, Any], base: Mapping[str, str]) -> dict[str, str]:
        """The container's environment over ``base`` (PATH, HOSTNAME, KUBERNETES_SERVICE_*)."""
        try:
            return self._env(container, base)
        except kubernetes.client.ApiException as exc:
            raise InputError(
                f"container {container['name']!r} env: API error {exc.status} {exc.reason}"
            ) from exc

    def _env(self, container: Mapping[str, Any], base: Mapping[str, str]) -> dict[str, str]:
        env = dict(base)
        for source in container.get("envFrom", []):
            prefix = source.get("prefix", "")
            for kind, key in (("configMap", "configMapRef"), ("secret", "secretRef")):
                if (ref := source.get(key)) is not None:
                    data = self._object_data(kind, ref["name"], bool(ref.get("optional"))) or {}
                    env |= {prefix + k: v.decode(errors="replace") for k, v in data.items()}
        for var in container.get("env", []):
            value = self._env_value(var, container)
            if value is not None:
                env[var["name"]] = expand(value, env)
        return env

    def _env_value(self, var: Mapping[str, Any], container: Mapping[str, Any]) -> str | None:
        if "valueFrom" not in var:
            return str(var.get("value", ""))
        src = var["valueFrom"]
        if (field := src.get("fieldRef")) is not None:
            return field_value(self.pod, field["fieldPath"])
        if (res := src.get("resourceFieldRef")) is not None:
            kind, _, resource = res["resource"].partition(".")
            return str(container.get("resources", {}).get(kind, {}).get(resource, "0"))
        for kind, key in (("configMap", "configMapKeyRef"), ("secret", "secretKeyRef")):
            if (ref := src.get(key)) is not None:
                optional = bool(ref.get("optional"))
                data = self._object_data(kind, ref["name"], optional)
                if data is None or ref["key"] not in data:
                    if optional:
                        return None
                    raise InputError(f"env {var['name']!r}: {kind} {ref['name']!r} has no key {ref['key']!r}")
                return data[ref["key"]].decode(errors="replace")
        raise InputError(f"env {var['name']!r}: valueFrom {sorted(src)} is not supported")


def expand(value: str, env: Mapping[str, str]) -> str:
    """Kubernetes ``$(VAR)`` expansion: defined names are replaced, ``$$`` escapes, others stay."""

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))

    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)", sub, value)
