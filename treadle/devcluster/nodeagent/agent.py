"""The node agent: registers process nodes and runs the pods the scheduler binds to them.

One agent process per dev cluster serves every process node of it (``--node`` repeated) and owns
the cluster's bridge, its DNS server and its API relay (all on the bridge gateway). Per node it
keeps the Node's Ready condition and its ``kube-node-lease`` Lease fresh (the node controller's
heartbeat), and every ``SYNC_S`` lists the pods bound to it: a new pod gets a ``PodRunner``, a pod
being deleted is stopped within its grace period and then removed (grace 0, as the kubelet does),
a pod gone from the API is stopped at once. Status changes are reported as they happen.

The agent is SIGTERM-safe: it stops every pod, then removes its namespaces and bridge.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ipaddress
import logging
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes

from treadle.api import nodes as api_nodes
from treadle.devcluster import nodes
from treadle.devcluster.nodeagent import dns, images, kube, logs, net, pod, proxy

log = logging.getLogger(__name__)

SYNC_S = 0.5
"""How often the pods bound to a node are listed (a watch would be faster; a list is simpler)."""
LEASE_S = 40
RENEW_S = 10.0
REFRESH_S = 5.0
"""How often configMap / secret / token volumes are rewritten from the API."""
SIMULATED_ANNOTATION = "treadle.dev/simulated-gpus"


@dataclass(frozen=True)
class NodeSpec:
    """One process node: its name and what it offers the scheduler."""

    name: str
    cpu: str = "16"
    memory: str = "64Gi"
    pods: int = 110
    accelerator: str | None = None
    """With ``gpus``: a SIMULATED GPU node (labels and ``nvidia.com/gpu``; no device is there)."""
    gpus: int = 0


def render_node(spec: NodeSpec, address: str) -> dict[str, Any]:
    """The Node object of a process node (pure).

    A CPU node carries only the labels every node has, as a plain CPU node of a real cluster does;
    a GPU node those of the KWOK GPU pools (``nodes.render_node``), its taint and a
    ``treadle.dev/simulated-gpus`` annotation: the GPUs are capacity only.
    """
    gpu = spec.accelerator is not None and spec.gpus > 0
    # A GPU node of a class the KWOK pools know looks like one of them (product, memory, cpu, RAM).
    like = next((p for p in nodes.DEFAULT_POOLS if gpu and p.accelerator == spec.accelerator), None)
    if like is not None:
        pool = dataclasses.replace(like, name=spec.name, count=1, gpus_per_node=spec.gpus)
    else:
        pool = nodes.NodePool(spec.name, 1, spec.accelerator if gpu else None, spec.gpus,
                              cpu=spec.cpu, memory=spec.memory)  # fmt: skip
    node = nodes.render_node(pool, 0)
    node["metadata"]["name"] = spec.name
    labels = node["metadata"]["labels"]
    for kwok_only in ("type", api_nodes.POOL_LABEL):
        labels.pop(kwok_only)
    if not gpu:
        labels.pop(api_nodes.ACCELERATOR_LABEL)
    labels["kubernetes.io/hostname"] = spec.name
    node["metadata"]["annotations"] = {
        "node.alpha.kubernetes.io/ttl": "0",
        nodes.PROCESS_ANNOTATION: "process",
    }
    if gpu:
        node["metadata"]["annotations"][SIMULATED_ANNOTATION] = "true"
    for key in ("allocatable", "capacity"):
        node["status"][key]["pods"] = str(spec.pods)
    stamp = kube.now()
    node["status"]["conditions"] = [
        {"type": kind, "status": status, "reason": reason, "message": message,
         "lastHeartbeatTime": stamp, "lastTransitionTime": stamp}
        for kind, status, reason, message in (
            ("Ready", "True", "KubeletReady", "treadle node agent is posting ready status"),
            ("MemoryPressure", "False", "KubeletHasSufficientMemory", "no memory pressure"),
            ("DiskPressure", "False", "KubeletHasNoDiskPressure", "no disk pressure"),
            ("PIDPressure", "False", "KubeletHasSufficientPID", "no PID pressure"),
        )
    ]  # fmt: skip
    # No Hostname address: the API server would try the name first for ``kubectl logs``, and nothing
    # resolves it on this machine.
    node["status"]["addresses"] = [{"type": "InternalIP", "address": address}]
    node["status"]["daemonEndpoints"] = {"kubeletEndpoint": {"Port": logs.PORT}}
    node["status"]["nodeInfo"] |= {"kubeletVersion": "treadle-node-agent", "kubeProxyVersion": "none",
                                   "containerRuntimeVersion": "treadle-process://0.1"}  # fmt: skip
    return node


class IPPool:
    """Pod addresses of the cluster's subnet (the gateway excluded), handed out and taken back."""

    def __init__(self, subnet: ipaddress.IPv4Network) -> None:
        self.free = [h for h in subnet.hosts() if h != subnet.network_address + 1]
        self.taken: dict[str, ipaddress.IPv4Address] = {}

    def take(self, uid: str) -> ipaddress.IPv4Address:
        if uid not in self.taken:
            if not self.free:
                raise RuntimeError("no pod address left in the cluster's subnet")
            self.taken[uid] = self.free.pop(0)
        return self.taken[uid]

    def give_back(self, uid: str) -> None:
        if (addr := self.taken.pop(uid, None)) is not None:
            self.free.append(addr)


class NodeAgent:
    """One process node: its registration, heartbeat and pods."""

    def __init__(self, spec: NodeSpec, ctx: pod.Context, ips: IPPool) -> None:
        self.spec = spec
        self.ctx = ctx
        self.ips = ips
        self.runners: dict[str, pod.PodRunner] = {}
        self.tasks: dict[str, list[asyncio.Task[None]]] = {}
        self.stopping: set[str] = set()

    @property
    def client(self) -> kube.NodeClient:
        return self.ctx.client

    async def register(self) -> None:
        node = render_node(self.spec, str(self.ctx.network.gateway))
        await asyncio.to_thread(self.client.register_node, node)

    async def heartbeat(self) -> None:
        """Renew the Lease every ``RENEW_S`` and re-post the Ready condition with it."""
        uid = await asyncio.to_thread(self.client.node_uid, self.spec.name)
        while True:
            try:
                await asyncio.to_thread(self.client.renew_lease, self.spec.name, uid, LEASE_S)
                status = render_node(self.spec, str(self.ctx.network.gateway))["status"]
                await asyncio.to_thread(
                    self.client.patch_node_status, self.spec.name, {"conditions": status["conditions"]}
                )
            except kube.ERRORS as exc:
                log.warning("node %s: heartbeat failed: %s", self.spec.name, exc)
            await asyncio.sleep(RENEW_S)

    async def sync_forever(self) -> None:
        refreshed = 0.0
        loop = asyncio.get_running_loop()
        while True:
            try:
                pods = await asyncio.to_thread(self.client.pods_on, self.spec.name)
            except kube.ERRORS as exc:
                log.warning("node %s: listing pods failed: %s", self.spec.name, exc)
                await asyncio.sleep(SYNC_S)
                continue
            refresh = loop.time() - refreshed > REFRESH_S
            if refresh:
                refreshed = loop.time()
            try:
                await self.sync(pods, refresh=refresh)
            except Exception:  # a bug met by one pod must not stop the node: log it, go on with the next list
                log.exception("node %s: sync failed", self.spec.name)
            await asyncio.sleep(SYNC_S)

    async def sync(self, pods: list[dict[str, Any]], *, refresh: bool) -> None:
        seen = set()
        for obj in pods:
            uid = str(obj["metadata"]["uid"])
            seen.add(uid)
            runner = self.runners.get(uid)
            deleting = bool(obj["metadata"].get("deletionTimestamp"))
            if runner is None:
                if deleting:  # never started here: nothing to stop
                    await asyncio.to_thread(self.client.delete_pod_now, obj["metadata"]["namespace"],
                                            obj["metadata"]["name"], uid)  # fmt: skip
                    continue
                if obj.get("status", {}).get("phase") in ("Succeeded", "Failed"):
                    continue  # finished before this agent started: nothing to run again
                runner = self._start(obj)
            elif refresh and not deleting:
                await runner.refresh(obj)
            if deleting and uid not in self.stopping:
                grace = float(obj["metadata"].get("deletionGracePeriodSeconds", pod.DEFAULT_GRACE_S))
                self._spawn(uid, self._delete(runner, grace, remove=True))
        for uid in set(self.runners) - seen - self.stopping:
            self._spawn(uid, self._delete(self.runners[uid], 0.0, remove=False))

    def _start(self, obj: dict[str, Any]) -> pod.PodRunner:
        uid = str(obj["metadata"]["uid"])
        runner = pod.PodRunner(self.ctx, obj, self.ips.take(uid))
        self.runners[uid] = runner
        self._spawn(uid, runner.run())
        self._spawn(uid, self._report(runner))
        return runner

    def _spawn(self, uid: str, coro: Any) -> None:
        task: asyncio.Task[None] = asyncio.create_task(coro)
        task.add_done_callback(_log_failure)
        self.tasks.setdefault(uid, []).append(task)

    async def _report(self, runner: pod.PodRunner) -> None:
        """Patch the pod's status whenever it changes (from its runner's ``changed`` event)."""
        last: dict[str, Any] | None = None
        meta = runner.pod["metadata"]
        while True:
            await runner.changed.wait()
            runner.changed.clear()
            status = runner.status()
            if status == last:
                continue
            try:
                await asyncio.to_thread(
                    self.client.patch_pod_status, meta["namespace"], meta["name"], runner.uid, status
                )
                last = status
            except kube.ERRORS as exc:
                if isinstance(exc, kubernetes.client.ApiException) and exc.status in (404, 409):
                    return  # the pod is gone (or a namesake replaced it)
                log.warning("pod %s/%s: status patch failed: %s", meta["namespace"], meta["name"], exc)
                await asyncio.sleep(1.0)
                runner.changed.set()

    async def _delete(self, runner: pod.PodRunner, grace: float, *, remove: bool) -> None:
        """Stop the pod within ``grace`` seconds; then delete the object (``remove``) and forget it."""
        uid = runner.uid
        self.stopping.add(uid)
        meta = runner.pod["metadata"]
        try:
            await runner.stop(grace)
            if remove:
                # The final status first, as the kubelet does, then the object.
                with contextlib.suppress(*kube.ERRORS):
                    await asyncio.to_thread(
                        self.client.patch_pod_status, meta["namespace"], meta["name"], uid, runner.status()
                    )
                await asyncio.to_thread(self.client.delete_pod_now, meta["namespace"], meta["name"], uid)
        finally:
            current = asyncio.current_task()
            for task in self.tasks.pop(uid, []):
                if task is not current:
                    task.cancel()
            self.runners.pop(uid, None)
            self.ips.give_back(uid)
            self.stopping.discard(uid)

    async def stop_all(self) -> None:
        await asyncio.gather(*(r.stop(0.0) for r in self.runners.values()), return_exceptions=True)
        for tasks in self.tasks.values():
            for task in tasks:
                task.cancel()


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.error("node agent task failed", exc_info=exc)


@dataclass(frozen=True)
class Settings:
    """What ``python -m treadle.devcluster.nodeagent`` is told."""

    cluster: str
    kubeconfig: str
    state_dir: Path
    nodes: tuple[NodeSpec, ...]
    api_port: int
    tls_cert: Path
    tls_key: Path
    """Certificate and key of the log endpoint (the dev cluster's own)."""
    host: images.Host
    initial_backoff_s: float = 10.0


async def serve(settings: Settings) -> None:
    """Run until SIGTERM / SIGINT, then stop every pod and remove the cluster's network."""
    state = settings.state_dir / "net.json"
    # Whatever a previous agent of this cluster left (it was killed): its pods start again here.
    await asyncio.to_thread(net.cleanup, settings.cluster, state)
    network = await asyncio.to_thread(net.create_bridge, settings.cluster, state)
    client = kube.NodeClient.from_environment(settings.kubeconfig)
    ctx = pod.Context(
        client=client, cluster=settings.cluster, network=network, state_dir=settings.state_dir,
        host=settings.host,
        initial_backoff_s=settings.initial_backoff_s,
    )  # fmt: skip
    loop = asyncio.get_running_loop()
    gateway = str(network.gateway)
    dns_server = dns.Server()
    transport, _ = await loop.create_datagram_endpoint(lambda: dns_server, local_addr=(gateway, 53))
    relay = await proxy.serve(gateway, pod.API_PORT, settings.api_port)
    ips = IPPool(network.subnet)
    agents = [NodeAgent(spec, ctx, ips) for spec in settings.nodes]

    def find(namespace: str, name: str) -> pod.PodRunner | None:
        runners = (r for a in agents for r in a.runners.values())
        meta = ((r, r.pod["metadata"]) for r in runners)
        return next((r for r, m in meta if m["namespace"] == namespace and m["name"] == name), None)

    log_server = await logs.serve(gateway, settings.tls_cert, settings.tls_key, find)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    tasks = []
    try:
        for agent in agents:
            await agent.register()
            tasks += [asyncio.create_task(agent.heartbeat()), asyncio.create_task(agent.sync_forever())]
        tasks.append(asyncio.create_task(_dns_records(client, dns_server, gateway)))
        for task in tasks:
            task.add_done_callback(_log_failure)
        log.info("node agent: nodes %s on bridge %s (%s)", [s.name for s in settings.nodes], network.bridge,
                 network.subnet)  # fmt: skip
        await stop.wait()
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*(a.stop_all() for a in agents), return_exceptions=True)
        transport.close()
        relay.close()
        await log_server.cleanup()
        await asyncio.to_thread(net.cleanup, settings.cluster, state)
        client.close()


async def _dns_records(client: kube.NodeClient, server: dns.Server, gateway: str) -> None:
    """Rebuild the DNS table from every Service and EndpointSlice every ``SYNC_S``."""
    api_name = f"{pod.API_HOST}."
    while True:
        try:
            services = await asyncio.to_thread(client.list, "/api/v1/services")
            slices = await asyncio.to_thread(client.list, "/apis/discovery.k8s.io/v1/endpointslices")
            table = dns.records(services, slices)
            table[api_name] = [gateway]
            server.table = table
        except kube.ERRORS as exc:
            log.warning("DNS records not refreshed: %s", exc)
        await asyncio.sleep(SYNC_S)


def api_port(kubeconfig: Mapping[str, Any]) -> int:
    """The API server's port, from the cluster's kubeconfig (it listens on 127.0.0.1)."""
    server = str(kubeconfig["clusters"][0]["cluster"]["server"])
    return int(server.rsplit(":", 1)[1].rstrip("/"))
