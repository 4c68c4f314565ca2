"""One pod on a process node, from its network namespace to its deletion, as the kubelet runs it.

``PodRunner.run`` makes the pod's network namespace, ``/etc/hosts``, ``/etc/resolv.conf`` and
volumes, runs the init containers in order to completion, then every container under its
``restartPolicy`` with the kubelet's back-off (0 s, then 10 s doubling to 300 s;
``CrashLoopBackOff`` while waiting), and runs its startup, liveness and readiness probes. A
liveness or startup failure kills the container (SIGTERM, the grace period, SIGKILL of its process
group) and the restart policy decides what follows. ``PodRunner.stop`` ends the pod: SIGTERM to
every container, the grace period, then SIGKILL of every process left in the pod's network
namespace (which catches processes that left their group), and the namespace is deleted.

Every change of state is reported as the pod's status (phase, pod IP, conditions, container
statuses with restart counts, last states, exit codes and reasons), which is what the scheduler,
the EndpointSlice controller and ``kubectl`` read. Container output goes to
``<state dir>/pods/<namespace>_<name>_<uid>/<container>/<restart>.log``.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from treadle.devcluster.nodeagent import images, inputs, kube, launch, net, probes

log = logging.getLogger(__name__)

API_HOST = "kubernetes.default.svc.cluster.local"
API_PORT = 443
DEFAULT_GRACE_S = 30
START_TIMEOUT_S = 60.0  # namespaces and bind mounts take milliseconds; a hung start is a bug
BACKOFF_RESET_S = 600.0  # a container that ran this long without a crash restarts at once again


@dataclass(frozen=True)
class Context:
    """What every pod of a node shares."""

    client: kube.NodeClient
    cluster: str
    network: net.ClusterNet
    state_dir: Path
    host: images.Host
    initial_backoff_s: float = 10.0
    max_backoff_s: float = 300.0


def _read_to_eof(fd: int) -> None:
    while os.read(fd, 64):
        pass


def backoff(crashes: int, initial: float, cap: float) -> float:
    """Seconds before the restart after ``crashes`` earlier ones: the first at once, then doubling."""
    return 0.0 if crashes == 0 else min(cap, initial * 2 ** (crashes - 1))


@dataclass
class Container:
    """The live state of one container of the pod."""

    spec: dict[str, Any]
    init: bool = False
    state: dict[str, Any] = field(default_factory=lambda: {"waiting": {"reason": "ContainerCreating"}})
    last_state: dict[str, Any] = field(default_factory=dict)
    restart_count: int = 0
    crashes: int = 0
    """Restarts since the container last ran ``BACKOFF_RESET_S`` without a crash (the back-off's clock)."""
    started: bool = False
    ready: bool = False
    done: bool = False
    """Terminated for good: the restart policy will not start it again."""
    proc: asyncio.subprocess.Process | None = None
    env: dict[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return str(self.spec["name"])

    def status(self, uid: str) -> dict[str, Any]:
        running = "running" in self.state
        return {
            "name": self.name, "image": self.spec.get("image", ""), "imageID": "",
            "containerID": f"treadle://{uid}/{self.name}/{self.restart_count}",
            "ready": self.ready, "started": self.started and running, "restartCount": self.restart_count,
            "state": self.state, "lastState": self.last_state,
        }  # fmt: skip


def phase(init: list[Container], main: list[Container], restart_policy: str) -> str:
    """The pod phase from its containers (pure)."""
    for c in init:
        if c.done and c.state.get("terminated", {}).get("exitCode") != 0:
            return "Failed"
        if not c.done:
            return "Pending"
    if all(c.done for c in main):
        ok = all(c.state.get("terminated", {}).get("exitCode") == 0 for c in main)
        return "Succeeded" if ok else "Failed"
    if any("running" in c.state or c.restart_count > 0 or "terminated" in c.state for c in main):
        return "Running"
    return "Pending"


class PodRunner:
    """Runs one pod's containers as processes inside the pod's namespaces."""

    def __init__(self, ctx: Context, pod: dict[str, Any], pod_ip: ipaddress.IPv4Address) -> None:
        self.ctx = ctx
        self.pod = pod
        self.uid = str(pod["metadata"]["uid"])
        self.ip = pod_ip
        meta = pod["metadata"]
        self.dir = ctx.state_dir / "pods" / f"{meta['namespace']}_{meta['name']}_{self.uid}"
        spec = pod["spec"]
        self.restart_policy = str(spec.get("restartPolicy", "Always"))
        self.init = [Container(c, init=True) for c in spec.get("initContainers", [])]
        self.main = [Container(c) for c in spec.get("containers", [])]
        self.inputs = inputs.Inputs(ctx.client, pod, self.dir)
        self.netns: Path | None = None
        self.volumes: dict[str, Path] = {}
        self.start_time = kube.now()
        self.conditions: dict[str, tuple[str, str]] = {}  # type -> (status, lastTransitionTime)
        self.changed = asyncio.Event()
        self.stopping = False
        self._tasks: set[asyncio.Task[None]] = set()  # Events being posted

    # ----- status -------------------------------------------------------------------------------

    def _condition(self, kind: str, ok: bool) -> dict[str, Any]:
        status = "True" if ok else "False"
        if self.conditions.get(kind, ("", ""))[0] != status:
            self.conditions[kind] = (status, kube.now())
        return {"type": kind, "status": status, "lastTransitionTime": self.conditions[kind][1]}

    def status(self) -> dict[str, Any]:
        initialized = all(c.done for c in self.init)
        ready = all(c.ready for c in self.main)
        return {
            "phase": phase(self.init, self.main, self.restart_policy),
            "hostIP": str(self.ctx.network.gateway), "hostIPs": [{"ip": str(self.ctx.network.gateway)}],
            "podIP": str(self.ip), "podIPs": [{"ip": str(self.ip)}], "startTime": self.start_time,
            "conditions": [
                self._condition("PodReadyToStartContainers", self.netns is not None),
                self._condition("Initialized", initialized),
                self._condition("ContainersReady", ready), self._condition("Ready", ready),
                self._condition("PodScheduled", True),
            ],
            "initContainerStatuses": [c.status(self.uid) for c in self.init],
            "containerStatuses": [c.status(self.uid) for c in self.main],
        }  # fmt: skip

    def _event(self, reason: str, message: str, kind: str = "Normal") -> None:
        task = asyncio.create_task(
            asyncio.to_thread(self.ctx.client.post_event, self.pod, reason, message, kind)
        )
        task.add_done_callback(lambda t: t.exception())  # an Event that fails to post is not a pod failure
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ----- setup --------------------------------------------------------------------------------

    def _hostname(self) -> str:
        return str(self.pod["spec"].get("hostname") or self.pod["metadata"]["name"])[:63]

    def _write_etc(self) -> None:
        ns = self.pod["metadata"]["namespace"]
        hostname = self._hostname()
        etc = self.dir / "etc"
        etc.mkdir(parents=True, exist_ok=True)
        names = hostname
        if sub := self.pod["spec"].get("subdomain"):
            names = f"{hostname}.{sub}.{ns}.svc.cluster.local {hostname}"
        (etc / "hosts").write_text(
            f"127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost\n{self.ip}\t{names}\n"
        )
        (etc / "resolv.conf").write_text(
            f"search {ns}.svc.cluster.local svc.cluster.local cluster.local\n"
            f"nameserver {self.ctx.network.gateway}\noptions ndots:5\n"
        )
        (etc / "hostname").write_text(hostname + "\n")

    async def _setup(self) -> None:
        """Network namespace, /etc files and volumes; retried every 2 s while an input is missing."""
        self.dir.mkdir(parents=True, exist_ok=True)
        while self.netns is None:
            try:
                self.netns = await asyncio.to_thread(
                    net.create_pod_netns, self.ctx.cluster, self.ctx.network, self.uid, self.ip
                )
            except net.NetworkError as exc:
                self._waiting_all("ContainerCreating", f"pod sandbox: {exc}")
                self._event("FailedCreatePodSandBox", str(exc), "Warning")
                await asyncio.sleep(2.0)
        self._write_etc()
        self.changed.set()
        while True:
            try:
                self.volumes = await asyncio.to_thread(self.inputs.refresh_volumes)
                return
            except (inputs.InputError, OSError) as exc:
                self._waiting_all("ContainerCreating", str(exc))
                self._event("FailedMount", str(exc), "Warning")
            await asyncio.sleep(2.0)

    def _waiting_all(self, reason: str, message: str) -> None:
        for c in (*self.init, *self.main):
            if "waiting" in c.state:
                c.state = {"waiting": {"reason": reason, "message": message}}
        self.changed.set()

    async def refresh(self, pod: dict[str, Any]) -> None:
        """Take the pod object as last read (labels for the downward API) and rewrite the volumes."""
        self.pod = pod
        self.inputs.pod = pod
        if self.volumes:
            with contextlib.suppress(inputs.InputError, OSError):
                self.volumes = await asyncio.to_thread(self.inputs.refresh_volumes)

    # ----- containers ---------------------------------------------------------------------------

    async def _start(self, c: Container) -> asyncio.subprocess.Process:
        """Start the container's process; raises ImageUnknown or InputError."""
        spec = c.spec
        runtime = images.resolve(spec.get("image", ""), spec.get("command"), spec.get("args"), self.ctx.host)
        base = {
            **runtime.env, "HOSTNAME": self._hostname(), "HOME": "/root",
            "KUBERNETES_SERVICE_HOST": API_HOST, "KUBERNETES_SERVICE_PORT": str(API_PORT),
            "KUBERNETES_SERVICE_PORT_HTTPS": str(API_PORT), "KUBERNETES_PORT": f"tcp://{API_HOST}:{API_PORT}",
        }  # fmt: skip
        c.env = await asyncio.to_thread(self.inputs.env, spec, base)
        argv = [inputs.expand(a, c.env) for a in runtime.argv]
        cdir = self.dir / c.name
        cdir.mkdir(parents=True, exist_ok=True)
        mounts: list[tuple[str, str, bool]] = [
            (str(self.dir / "etc" / f), f"/etc/{f}", False) for f in ("hosts", "resolv.conf", "hostname")
        ]
        for m in spec.get("volumeMounts", []):
            if m["name"] not in self.volumes:
                raise inputs.InputError(f"volumeMount {m['name']!r}: no such volume in the pod")
            source = self.volumes[m["name"]] / m.get("subPath", "")
            mounts.append((str(source).rstrip("/"), m["mountPath"], bool(m.get("readOnly"))))
        work = cdir / "work"
        work.mkdir(exist_ok=True)
        error_file = cdir / "start-error"
        error_file.unlink(missing_ok=True)
        launch_spec = {
            "netns": str(self.netns), "hostname": self._hostname(), "mounts": mounts,
            "cwd": spec.get("workingDir") or str(work), "argv": argv, "env": c.env,
            "error_file": str(error_file),
        }  # fmt: skip
        spec_file = cdir / "launch.json"
        read_end, write_end = os.pipe()
        spec_file.write_text(json.dumps(launch_spec | {"started_fd": write_end}))
        try:
            with open(cdir / f"{c.restart_count}.log", "ab") as logf:  # noqa: ASYNC230 (open is instant)
                proc = await asyncio.create_subprocess_exec(
                    sys.executable, launch.__file__, str(spec_file),
                    stdin=asyncio.subprocess.DEVNULL, stdout=logf, stderr=asyncio.subprocess.STDOUT,
                    start_new_session=True, pass_fds=(write_end,),
                )  # fmt: skip
            os.close(write_end)
            write_end = -1
            await asyncio.wait_for(asyncio.to_thread(_read_to_eof, read_end), START_TIMEOUT_S)
        finally:
            os.close(read_end)
            if write_end >= 0:
                os.close(write_end)
        return proc

    def _grace(self) -> float:
        return float(self.pod["spec"].get("terminationGracePeriodSeconds", DEFAULT_GRACE_S))

    async def _kill(self, c: Container, grace: float) -> None:
        """SIGTERM the container's process group, SIGKILL it after ``grace`` seconds."""
        proc = c.proc
        if proc is None or proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.wait(), grace)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()

    async def _run_container(self, c: Container) -> None:
        """Start, watch and restart one container until its restart policy says it is done."""
        policy = self.restart_policy
        if c.init and policy == "Always":
            policy = "OnFailure"  # init containers run to completion: Always restarts them on failure only
        while not self.stopping:
            try:
                c.proc = await self._start(c)
            except images.ImageUnknown as exc:
                c.state = {"waiting": {"reason": "ErrImageNeverPull", "message": str(exc)}}
                self._event("ErrImageNeverPull", str(exc), "Warning")
                self.changed.set()
                return
            except inputs.InputError as exc:
                c.state = {"waiting": {"reason": "CreateContainerConfigError", "message": str(exc)}}
                self._event("Failed", str(exc), "Warning")
                self.changed.set()
                await asyncio.sleep(2.0)
                continue
            started_at, started_mono = kube.now(), time.monotonic()
            c.state = {"running": {"startedAt": started_at}}
            c.started = c.ready = False
            self._event("Started", f"Started container {c.name}")
            self.changed.set()
            killer = asyncio.create_task(self._probe(c)) if not c.init else None
            code = await c.proc.wait()
            if killer is not None:
                killer.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await killer
            c.ready = False
            exit_code = 128 - code if code < 0 else code
            reason = "Completed" if exit_code == 0 else "Error"
            terminated: dict[str, Any] = {"exitCode": exit_code, "reason": reason, "startedAt": started_at,
                                          "finishedAt": kube.now()}  # fmt: skip
            start_error = self.dir / c.name / "start-error"
            if start_error.is_file():
                terminated |= {"reason": "StartError", "message": start_error.read_text()}
            c.state = {"terminated": terminated}
            self.changed.set()
            if self.stopping or policy == "Never" or (policy == "OnFailure" and exit_code == 0):
                c.done = True
                self.changed.set()
                return
            c.crashes = 0 if time.monotonic() - started_mono > BACKOFF_RESET_S else c.crashes
            delay = backoff(c.crashes, self.ctx.initial_backoff_s, self.ctx.max_backoff_s)
            c.crashes += 1
            if delay > 0:
                pod_name = self.pod["metadata"]["name"]
                message = f"back-off {delay:g}s restarting failed container={c.name} pod={pod_name}"
                c.last_state, c.state = (
                    c.state,
                    {"waiting": {"reason": "CrashLoopBackOff", "message": message}},
                )
                self.changed.set()
                await asyncio.sleep(delay)
            else:
                c.last_state = c.state
            c.restart_count += 1

    async def _probe(self, c: Container) -> None:
        """Startup, then liveness and readiness probes of a running container; kills it on failure."""
        spec = c.spec
        assert c.proc is not None
        pid = c.proc.pid
        startup = spec.get("startupProbe")
        if startup is not None and not await self._probe_until(c, startup, pid):
            self._event("Unhealthy", f"Startup probe failed; killing container {c.name}", "Warning")
            await self._kill(c, self._grace())
            return
        c.started = True
        readiness = spec.get("readinessProbe")
        c.ready = readiness is None
        self.changed.set()
        tasks = []
        if readiness is not None:
            tasks.append(self._readiness(c, readiness, pid))
        if (liveness := spec.get("livenessProbe")) is not None:
            tasks.append(self._liveness(c, liveness, pid))
        await asyncio.gather(*tasks)

    async def _probe_until(self, c: Container, probe: Mapping[str, Any], pid: int) -> bool:
        """Probe each period until ``successThreshold`` passes (True) or ``failureThreshold`` fail (False)."""
        s = probes.Settings.of(probe)
        await asyncio.sleep(s.initial_delay_s)
        ok_run = fail_run = 0
        while True:
            ok, message = await probes.run(probe, c.spec, str(self.ip), pid, c.env)
            ok_run, fail_run = (ok_run + 1, 0) if ok else (0, fail_run + 1)
            if ok_run >= s.success_threshold:
                return True
            if fail_run >= s.failure_threshold:
                self._event("Unhealthy", message, "Warning")
                return False
            await asyncio.sleep(s.period_s)

    async def _readiness(self, c: Container, probe: Mapping[str, Any], pid: int) -> None:
        s = probes.Settings.of(probe)
        await asyncio.sleep(s.initial_delay_s)
        ok_run = fail_run = 0
        while True:
            ok, message = await probes.run(probe, c.spec, str(self.ip), pid, c.env)
            ok_run, fail_run = (ok_run + 1, 0) if ok else (0, fail_run + 1)
            ready = c.ready
            if ok and ok_run >= s.success_threshold:
                ready = True
            elif not ok and fail_run >= s.failure_threshold:
                ready = False
            if ready != c.ready:
                c.ready = ready
                if not ready:
                    self._event("Unhealthy", f"Readiness probe failed: {message}", "Warning")
                self.changed.set()
            await asyncio.sleep(s.period_s)

    async def _liveness(self, c: Container, probe: Mapping[str, Any], pid: int) -> None:
        s = probes.Settings.of(probe)
        await asyncio.sleep(s.initial_delay_s)
        failures = 0
        while True:
            ok, message = await probes.run(probe, c.spec, str(self.ip), pid, c.env)
            failures = 0 if ok else failures + 1
            if failures >= s.failure_threshold:
                break
            await asyncio.sleep(s.period_s)
        self._event("Unhealthy", f"Liveness probe failed: {message}", "Warning")
        self._event("Killing", f"Container {c.name} failed liveness probe, will be restarted", "Warning")
        await self._kill(c, float(probe.get("terminationGracePeriodSeconds", self._grace())))

    # ----- whole pod ----------------------------------------------------------------------------

    async def run(self) -> None:
        """Set up, run the init containers in order, then every container."""
        self.changed.set()
        await self._setup()
        for c in self.init:
            await self._run_container(c)
            if c.state.get("terminated", {}).get("exitCode") != 0:
                return  # the pod failed (restartPolicy Never) or is stopping
        await asyncio.gather(*(self._run_container(c) for c in self.main))

    async def stop(self, grace: float) -> None:
        """Terminate every container (SIGTERM, ``grace`` seconds, SIGKILL), then the pod's namespace."""
        self.stopping = True
        await asyncio.gather(*(self._kill(c, grace) for c in (*self.init, *self.main)))
        if self.netns is not None:
            with contextlib.suppress(FileNotFoundError):
                await asyncio.to_thread(net.kill_netns_processes, net.netns_inode(self.netns))
            await asyncio.to_thread(net.delete_pod_netns, self.ctx.cluster, self.uid)
        for task in self._tasks:
            task.cancel()
