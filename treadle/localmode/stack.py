"""Start Treadle's services as processes on 127.0.0.1, wait until each is healthy, and stop them.

Used by ``treadle.localmode.run`` (``treadle run``) and by the integration tests, which also kill
and restart single processes (an environment server mid-run). Each process logs to
``<run dir>/<name>.log``; a process that exits or does not become healthy in time raises
``StartFailed`` with the tail of its log, and one that exits later, while ``unless_one_exits`` runs
a piece of work, ends that work with ``ServiceExited``. Each process is SIGKILLed by the kernel when
the process that started it dies, however it died: a killed ``treadle run`` or ``treadle train``
leaves no service behind. (An orderly stop is ``stop``'s: SIGTERM first.)
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Sequence
from pathlib import Path
from typing import TypeVar

import httpx

from treadle.services.grpcutil import server as grpc_server
from treadle.testing import procs


class StartFailed(RuntimeError):
    """A service process exited or stayed unhealthy; the message carries its log's tail."""


class ServiceExited(RuntimeError):
    """A service process exited while the run needed it; the message names it, its exit status and
    its log, and carries the log's tail."""


@dataclasses.dataclass
class Proc:
    name: str
    argv: list[str]
    port: int
    kind: str
    """"http" (GET /healthz or /health), "grpc" (standard health service) or "tcp" (the port accepts)."""
    log: Path
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    """Variables set on top of this process's environment (what a pod spec would set)."""
    popen: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def tail(self, n: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-n:] if self.log.exists() else ""


T = TypeVar("T")
EXIT_POLL_S = 0.5


class Stack:
    """The processes of one local run, started in order and stopped in reverse."""

    def __init__(self, run_dir: Path, *, python: str = sys.executable) -> None:
        self.run_dir = run_dir
        self.python = python
        self.procs: dict[str, Proc] = {}
        run_dir.mkdir(parents=True, exist_ok=True)

    async def start(
        self, name: str, module: str, args: Sequence[str], *, kind: str, env: dict[str, str] | None = None,
        health_path: str = "/healthz", timeout_s: float = 60.0,
    ) -> Proc:  # fmt: skip
        """Run ``python -m module --host 127.0.0.1 --port <free> *args`` with ``env`` added; wait until
        healthy."""
        port = procs.free_port()
        argv = [self.python, "-m", module, "--host", "127.0.0.1", "--port", str(port), *args]
        return await self.launch(name, argv, port=port, kind=kind, env=env, health_path=health_path,
                                 timeout_s=timeout_s)  # fmt: skip

    async def launch(
        self, name: str, argv: Sequence[str], *, port: int, kind: str, env: dict[str, str] | None = None,
        health_path: str = "/healthz", timeout_s: float = 60.0,
    ) -> Proc:  # fmt: skip
        """Run ``argv`` (which must listen on 127.0.0.1:``port``) with ``env`` added; wait until healthy."""
        proc = Proc(name=name, argv=list(argv), port=port, kind=kind, log=self.run_dir / f"{name}.log",
                    env=dict(env or {}))  # fmt: skip
        self.procs[name] = proc
        await self._spawn(proc, health_path=health_path, timeout_s=timeout_s)
        return proc

    async def _spawn(self, proc: Proc, *, health_path: str, timeout_s: float) -> None:
        proc.popen = _popen(proc)
        deadline = time.monotonic() + timeout_s
        while not await self._healthy(proc, health_path):
            if proc.popen.poll() is not None:
                raise StartFailed(f"{proc.name} exited with {proc.popen.returncode}:\n{proc.tail()}")
            if time.monotonic() > deadline:
                raise StartFailed(f"{proc.name} not healthy after {timeout_s}s:\n{proc.tail()}")
            await asyncio.sleep(0.1)

    async def _healthy(self, proc: Proc, health_path: str) -> bool:
        if proc.kind == "grpc":
            return await grpc_server.check_health(proc.address, timeout_s=1.0)
        if proc.kind == "tcp":
            return procs.port_open(proc.port)
        try:
            async with httpx.AsyncClient(timeout=1.0) as client:
                return (await client.get(proc.url + health_path)).status_code == 200
        except httpx.HTTPError:
            return False

    def kill(self, name: str) -> None:
        """SIGKILL one process (the failure tests' crash), without waiting for anything."""
        popen = self.procs[name].popen
        if popen is not None and popen.poll() is None:
            popen.send_signal(signal.SIGKILL)
            popen.wait()

    async def restart(self, name: str, *, health_path: str = "/healthz", timeout_s: float = 60.0) -> Proc:
        """Start a killed process again on the same port."""
        proc = self.procs[name]
        self.kill(name)
        await self._spawn(proc, health_path=health_path, timeout_s=timeout_s)
        return proc

    async def unless_one_exits(self, work: Awaitable[T]) -> T:
        """``work``'s result, unless a process of the stack exits first: then ``work`` is cancelled
        and ``ServiceExited`` names that process (a service never exits on its own while in use)."""
        task = asyncio.ensure_future(work)
        watcher = asyncio.create_task(self._first_exit())
        try:
            done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pending in (task, watcher):
                pending.cancel()
            await asyncio.gather(task, watcher, return_exceptions=True)
        if task in done:  # the work ended first, however it ended
            return task.result()
        proc = watcher.result()
        assert proc.popen is not None
        raise ServiceExited(
            f"{proc.name} exited with {proc.popen.returncode} while the run needed it; its log is "
            f"{proc.log}, ending:\n{proc.tail(1500)}"
        )

    async def _first_exit(self) -> Proc:
        while True:
            for proc in self.procs.values():
                if proc.popen is not None and proc.popen.poll() is not None:
                    return proc
            await asyncio.sleep(EXIT_POLL_S)

    def stop(self) -> None:
        """SIGTERM every process in reverse start order, SIGKILL after a grace period."""
        for proc in reversed(list(self.procs.values())):
            if proc.popen is not None:
                with contextlib.suppress(ProcessLookupError):
                    procs.stop(proc.popen, grace=5.0)

    def __enter__(self) -> Stack:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


_DIE_WITH_PARENT = """
import ctypes, os, signal, sys
ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG, kept across exec
if os.getppid() != int(sys.argv[1]):
    sys.exit("the process that started this one is gone")
os.execvp(sys.argv[2], sys.argv[2:])
"""
"""Run before a service: Linux kills it when its parent dies. SIGKILL, not SIGTERM: a server's graceful
shutdown may wait on its open connections for good, and nothing is left to escalate. A launcher rather
than ``preexec_fn``, which may deadlock in a child forked from a threaded parent; it costs one
interpreter start (-I -S)."""


def _popen(proc: Proc) -> subprocess.Popen[bytes]:
    # Popen returns at once (the child is forked, not waited for); the log is appended across restarts.
    # A session of its own: a Ctrl-C meant for the run reaches the run, which stops its services in order.
    argv = [sys.executable, "-I", "-S", "-c", _DIE_WITH_PARENT, str(os.getpid()), *proc.argv]
    with open(proc.log, "ab") as log:
        return subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, **proc.env, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip
