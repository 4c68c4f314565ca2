"""One run of a container probe, as the kubelet runs it: from the node, against the pod's IP.

``httpGet`` (2xx/3xx passes), ``tcpSocket`` (a connection opens), ``grpc`` (the standard health
service answers SERVING) and ``exec`` (the command exits 0, run inside the container's namespaces
with ``nsenter``). Each is bounded by the probe's ``timeoutSeconds``; the result is a pass flag and
a message for the Events and the container status.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import httpx
from grpc_health.v1 import health_pb2, health_pb2_grpc


@dataclass(frozen=True)
class Settings:
    """A probe's timing fields with the Kubernetes defaults."""

    initial_delay_s: float
    period_s: float
    timeout_s: float
    success_threshold: int
    failure_threshold: int

    @classmethod
    def of(cls, probe: Mapping[str, Any]) -> Settings:
        return cls(
            initial_delay_s=float(probe.get("initialDelaySeconds", 0)),
            period_s=float(probe.get("periodSeconds", 10)),
            timeout_s=float(probe.get("timeoutSeconds", 1)),
            success_threshold=int(probe.get("successThreshold", 1)),
            failure_threshold=int(probe.get("failureThreshold", 3)),
        )


def port_number(port: int | str, container: Mapping[str, Any]) -> int:
    """A probe's or Service's port: a number, or the name of one of the container's ports."""
    if isinstance(port, int) or str(port).isdigit():
        return int(port)
    for p in container.get("ports", []):
        if p.get("name") == port:
            return int(p["containerPort"])
    raise ValueError(f"port {port!r}: no container port of that name in container {container.get('name')!r}")


async def run(
    probe: Mapping[str, Any], container: Mapping[str, Any], pod_ip: str, pid: int, env: Mapping[str, str]
) -> tuple[bool, str]:
    """Run ``probe`` once; ``pid`` is the container's process (for ``exec``)."""
    timeout = Settings.of(probe).timeout_s
    try:
        async with asyncio.timeout(timeout):
            return await _run(probe, container, pod_ip, pid, env)
    except TimeoutError:
        return False, f"probe timed out after {timeout:g}s"
    except (OSError, ValueError, httpx.HTTPError, grpc.RpcError) as exc:
        return False, f"probe failed: {exc}"


async def _run(
    probe: Mapping[str, Any], container: Mapping[str, Any], pod_ip: str, pid: int, env: Mapping[str, str]
) -> tuple[bool, str]:
    if (http := probe.get("httpGet")) is not None:
        port = port_number(http["port"], container)
        scheme = str(http.get("scheme", "HTTP")).lower()
        url = f"{scheme}://{http.get('host') or pod_ip}:{port}{http.get('path', '/')}"
        headers = {h["name"]: h["value"] for h in http.get("httpHeaders", [])}
        async with httpx.AsyncClient(verify=False) as client:  # the kubelet skips verification too
            response = await client.get(url, headers=headers)
        return 200 <= response.status_code < 400, f"HTTP probe {url}: status {response.status_code}"
    if (tcp := probe.get("tcpSocket")) is not None:
        port = port_number(tcp["port"], container)
        _, writer = await asyncio.open_connection(tcp.get("host") or pod_ip, port)
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return True, f"TCP probe {pod_ip}:{port}: connected"
    if (rpc := probe.get("grpc")) is not None:
        port = port_number(rpc["port"], container)
        async with grpc.aio.insecure_channel(f"{pod_ip}:{port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            reply = await stub.Check(health_pb2.HealthCheckRequest(service=rpc.get("service", "")))
        status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
        return reply.status == health_pb2.HealthCheckResponse.SERVING, f"gRPC probe {pod_ip}:{port}: {status}"
    if (exe := probe.get("exec")) is not None:
        return await _exec(exe.get("command", []), pid, env)
    raise ValueError("probe: none of httpGet, tcpSocket, grpc, exec is set")


async def _exec(command: Sequence[str], pid: int, env: Mapping[str, str]) -> tuple[bool, str]:
    proc = await asyncio.create_subprocess_exec(
        "nsenter", "-t", str(pid), "-n", "-m", "-u", "--", *command,
        env=dict(env), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    try:
        out, _ = await proc.communicate()
    finally:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
    text = out.decode(errors="replace").strip()[-500:]
    return proc.returncode == 0, f"exec probe {list(command)!r}: exit {proc.returncode} {text}".strip()
