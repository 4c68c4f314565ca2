"""Run untrusted Python in a throwaway directory with hard limits; called by the python-code env and
the reward gateway's ``code-tests`` function.

Containment, when the service runs as root with CAP_SYS_ADMIN (this dev machine, the dev cluster's
process nodes):
- a fresh **network namespace** (``unshare(CLONE_NEWNET)``): no interface but a down loopback;
- a fresh **mount namespace** with private tmpfs over ``/tmp``, ``/var/tmp`` and ``/dev/shm``, so files
  written outside the working directory vanish with the run;
- a **uid of its own** per concurrent slot (``uid_range`` of the sandbox + slot, no passwd entry; no
  two sandboxes of a host share one, whichever process holds them): it owns only the
  throwaway working directory, ``RLIMIT_NPROC`` then bounds that run alone (fork bombs), and the
  cleanup kills every process of that uid with ``kill(-1)`` from a child that took the uid, which also
  catches processes that left the process group;
- rlimits: CPU seconds, address space (memory), processes, file size, open files, no core dumps;
- a wall-clock timeout and an output cap enforced by the parent;
- with a core manager (``cores.CoreManager``; ``cpus=N`` makes one with ``upper = N``), **cores
  granted per action**: the run waits for its grant (ARL-Tangram's elastic scheduler over the pod's
  FCFS queue of runs), is pinned (``sched_setaffinity``) to exactly the granted cores, which no
  other run holds meanwhile, and reads the count in ``TREADLE_GRANTED_CORES`` and
  ``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS`` / ``OPENBLAS_NUM_THREADS``. Affinity rather than a cgroup
  quota: a pod's container may not write its own cgroup, and pinning bounds parallelism exactly (a
  quota would let N threads burst on N cores and then throttle).

Each run is started in two halves: **start** (working directory, uid, namespaces, rlimits, the
interpreter itself, which then blocks reading one line from stdin) and **go** (write ``main.py``, wait
for the grant, pin the cores, send the line with the grant's variables (a warm process started before
its grant was known) and the run's stdin; the wall clock starts here). Start is what a run pays before
any user code: fork, namespaces and the interpreter's boot, tens of milliseconds on the dev machine,
against some 35 us for the directory. With ``warm=N`` the sandbox keeps N started processes ready
(their own uids, beyond the ``concurrency`` slots) and refills in the background once a run that took
one has ended (a start beside it would take CPU from it); a run under other limits than the
sandbox's starts its own. A warm process is indistinguishable to the code it runs: the same
bootstrap, environment and limits, a fresh directory, and nothing of it outlives its run.

Without CAP_SYS_ADMIN (the shipped images run as uid 65532 with no capability; a root container
without it) the run is confined with Landlock and seccomp instead (``confine``: no socket, no new
process, no signal, reads only of system directories, writes only in its directory), still under a
uid of its own when the service is root (CAP_SETUID). Where neither is possible the sandbox refuses
to start (``confine.Unavailable``, naming what is missing): it never runs code with less.
``Result.isolation`` says which mode ran. docs/SECURITY.md ("Sandbox") compares the two.

``run_connected`` runs two programs at once, each a started process of its own, and relays each
one's channel (``channel``) to the other: ``codetests`` runs a response and its tests' harness so.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ctypes
import ctypes.util
import dataclasses
import itertools
import json
import logging
import os
import resource
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from typing import Any, Literal

from treadle.sandbox import channel as channel_mod
from treadle.sandbox import confine, reaping
from treadle.sandbox import cores as cores_mod

log = logging.getLogger(__name__)

Status = Literal["ok", "error", "timeout", "cpu_limit", "memory_limit", "output_limit"]
Isolation = Literal["namespaces", "landlock"]

UID_BASE = 1_800_000
UIDS_PER_SANDBOX = 1024  # a sandbox's slots (two per concurrent run, one per warm process)
_sandboxes = itertools.count()


def uid_range() -> int:
    """The first uid of a new sandbox, apart from every other sandbox of the host (another process's
    too): a shared uid lets one's cleanup (``kill(-1)``) end the other's runs, under one RLIMIT_NPROC."""
    return UID_BASE + ((os.getpid() % 4096) * 16 + next(_sandboxes) % 16) * UIDS_PER_SANDBOX


CLONE_NEWNS, CLONE_NEWNET = 0x00020000, 0x40000000
MS_NOSUID, MS_NODEV, MS_REC, MS_PRIVATE = 0x2, 0x4, 0x4000, 0x40000
PR_SET_CHILD_SUBREAPER = 36
CAP_KILL, CAP_SETGID, CAP_SETUID, CAP_SYS_ADMIN, CAP_CHOWN = 5, 6, 7, 21, 0

GO = b"go "
"""The start of the line a started process waits for; the run's variables (JSON), newline, stdin follow."""
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
GRANTED_CORES = "TREADLE_GRANTED_CORES"
"""The cores granted to the run (the thread variables say the same to thread pools)."""

# Runs in the child before the user's file: wait for the go line, set its variables, then the user code
# as __main__. The line is read from fd 0 a byte at a time: a buffered read
# would take the run's stdin into sys.stdin's buffer, out of reach of code that reads fd 0.
_BOOTSTRAP = """
import json, os, runpy, sys
go = b""
while not go.endswith(b"\\n"):
    chunk = os.read(0, 1)
    if not chunk or len(go) > 4096:  # the variables are a few dozen bytes
        sys.exit(0)
    go += chunk
if not go.startswith(b"go "):
    sys.exit(0)
os.environ.update(json.loads(go[3:]))
sys.argv = ["main.py"]
runpy.run_path("main.py", run_name="__main__")
"""


@dataclasses.dataclass(frozen=True)
class Limits:
    wall_s: float = 10.0
    """Wall-clock seconds before every process of the run is killed (status ``timeout``)."""
    cpu_s: int = 5
    """CPU seconds (RLIMIT_CPU); exceeding it ends the run with status ``cpu_limit``."""
    memory_bytes: int = 512 * 1024 * 1024
    """Address space per process (RLIMIT_AS); Python reports MemoryError (status ``memory_limit``)."""
    max_processes: int = 32
    """Processes and threads of the run's uid (RLIMIT_NPROC, with a uid per run): a fork bomb stops
    here. Under Landlock without root a run cannot fork at all (its threads are bounded by memory)."""
    max_file_bytes: int = 16 * 1024 * 1024
    """Largest file the run may write (RLIMIT_FSIZE)."""
    max_output_bytes: int = 64 * 1024
    """stdout + stderr kept; more ends the run with status ``output_limit``."""


@dataclasses.dataclass(frozen=True)
class Result:
    status: Status
    exit_code: int | None
    stdout: str
    stderr: str
    wall_s: float
    isolation: Isolation

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@dataclasses.dataclass
class _Started:
    """A process past the start half of a run, blocked on the go line."""

    proc: asyncio.subprocess.Process
    workdir: str
    slot: int
    channel: channel_mod.Channel


def unavailable_or(build: Callable[[], Sandbox]) -> Sandbox | confine.Unavailable:
    """``build()``, or why no sandbox can run here (logged): a service whose untrusted code runs only
    on some requests (a ``code-tests`` reward, a ``python-code`` env) refuses those, with the reason,
    and serves the rest."""
    try:
        return build()
    except confine.Unavailable as e:
        log.error("the code sandbox cannot run here: %s", e)
        return e


class Sandbox:
    """Runs code under ``limits``; at most ``concurrency`` runs at once, each under a uid of its own.

    ``cores``: the pod's core manager; ``cpus``: make one granting at most that many cores per run
    (neither: every CPU of this process, and no thread variables set). ``warm``: started processes
    kept ready (see the module docstring); ``start_warm`` begins filling.
    """

    def __init__(
        self,
        *,
        limits: Limits | None = None,
        concurrency: int = 8,
        python: str | None = None,
        cpus: int | None = None,
        cores: cores_mod.CoreManager | None = None,
        warm: int = 0,
    ) -> None:
        self.limits = limits or Limits()
        self.warm = warm
        self._running = asyncio.Semaphore(concurrency)
        # Two uids per run in flight (``run_connected`` takes two processes) plus one per warm process:
        # a warm process never shares a uid with a run, whose cleanup kills every process of its uid.
        self._slots: asyncio.Queue[int] = asyncio.Queue()
        if 2 * concurrency + warm > UIDS_PER_SANDBOX:
            raise ValueError(f"concurrency: 2 x concurrency + warm must be <= {UIDS_PER_SANDBOX}")
        for slot in range(2 * concurrency + warm):
            self._slots.put_nowait(slot)
        self.uid_base = uid_range()
        self._ready: collections.deque[_Started] = collections.deque()
        self._refill: asyncio.Task[None] | None = None
        self._closed = False
        self.cores = cores if cores is not None or cpus is None else cores_mod.CoreManager(upper=cpus)
        # A uid per slot whenever we may switch: the run then owns only its directory.
        self.own_uids = os.geteuid() == 0
        self.confinement: confine.Confinement | None = None
        self.isolation: Isolation = "namespaces"
        switch = (CAP_SETUID, CAP_SETGID, CAP_KILL, CAP_CHOWN)
        if not (self.own_uids and confine.capable(CAP_SYS_ADMIN, *switch)):
            if self.own_uids and not confine.capable(*switch):
                raise confine.Unavailable(
                    "the sandbox runs as root here but lacks CAP_SETUID, CAP_SETGID, CAP_KILL or "
                    "CAP_CHOWN (securityContext.capabilities): run the pod as a non-root user instead"
                )
            self.confinement, self.isolation = confine.load(), "landlock"
        # The sandbox uid must be able to reach the interpreter: the venv's (and pyenv's) may sit under
        # a home directory it cannot enter. -I keeps the child to the standard library.
        self.python = python or confine.interpreter(needs_world_access=self.own_uids)
        # Working directories live outside /tmp, /var/tmp and /dev/shm, which the run sees as empty tmpfs.
        self.workroot: str | None = os.environ.get("TREADLE_SANDBOX_DIR")
        if self.isolation == "namespaces":
            self.workroot = self.workroot or "/var/lib/treadle-sandbox"
            os.makedirs(self.workroot, mode=0o711, exist_ok=True)
            os.chmod(self.workroot, 0o711)
        if self.own_uids:
            # Orphans of a run (a fork bomb's children) become our children, so we can reap them:
            # unreaped zombies would keep counting against the slot uid's RLIMIT_NPROC.
            libc = _libc()
            if libc is not None:
                libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)

    @property
    def warm_ready(self) -> int:
        """Started processes waiting for a run."""
        return len(self._ready)

    def start_warm(self) -> None:
        """Fill the warm processes in the background (no-op without ``warm`` or while filling)."""
        if self.warm and not self._closed and (self._refill is None or self._refill.done()):
            self._refill = asyncio.create_task(self._fill())

    async def close(self) -> None:
        """Stop refilling and end the warm processes; runs in flight finish on their own."""
        self._closed = True
        if self._refill is not None:
            self._refill.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._refill
        while self._ready:
            await self._end(self._ready.popleft())

    async def run(
        self, code: str, *, stdin: str = "", limits: Limits | None = None, kind: str = "run"
    ) -> Result:
        """Run ``code``; ``kind`` names the action for the core manager's profiles (e.g. ``python-code``)."""
        (result,) = await self._run_all([(code, stdin)], limits or self.limits, kind)
        return result

    async def run_connected(
        self, first: str, second: str, *, limits: Limits | None = None, kind: str = "run"
    ) -> tuple[Result, Result]:
        """Run two programs at once, each in a process, uid and directory of its own, under one grant;
        each reads what the other writes on its channel (``channel``: the service relays). Neither
        reaches the other's output, files or process, so what one tells the other is data, and the
        output of one is its own (``codetests``' verdict)."""
        one, two = await self._run_all([(first, ""), (second, "")], limits or self.limits, kind)
        return one, two

    async def _run_all(self, programs: list[tuple[str, str]], limits: Limits, kind: str) -> list[Result]:
        asked = time.monotonic()
        async with self._running:
            waited = time.monotonic() - asked
            started: list[_Started] = []
            try:
                for _ in programs:
                    # Taken only once running: a run that waits holds no uid, so uids never run out.
                    warm = self._ready.popleft() if self._ready and limits == self.limits else None
                    if warm is not None and warm.proc.returncode is not None:  # it died waiting
                        await self._end(warm)
                    elif warm is not None:
                        started.append(warm)
                # The rest start side by side: their interpreters boot at once.
                fresh = [self._start(limits) for _ in range(len(programs) - len(started))]
                outcomes = await asyncio.gather(*fresh, return_exceptions=True)
                started += [each for each in outcomes if isinstance(each, _Started)]  # ended below
                for each in outcomes:
                    if isinstance(each, BaseException):
                        raise each
                manager = self.cores
                if manager is None:
                    return await self._go_all(started, programs, limits, None)
                async with manager.cores(kind) as grant:
                    results = await self._go_all(started, programs, limits, grant)
            finally:
                for each in started:
                    await self._end(each)
                self.start_warm()
        # Queue: the wait for a sandbox slot and for the grant; the rest beside the run is overhead.
        manager.metrics.phases(
            cores_mod.CPU, queue_s=waited + grant.queued_s,
            execution_s=max(r.wall_s for r in results), total_s=time.monotonic() - asked,
        )  # fmt: skip
        return results

    async def _go_all(
        self, started: list[_Started], programs: list[tuple[str, str]], limits: Limits,
        grant: cores_mod.Grant | None,
    ) -> list[Result]:  # fmt: skip
        relays = []
        if len(started) == 2:
            one, two = (each.channel for each in started)
            relays = [asyncio.create_task(channel_mod.relay(*pair)) for pair in ((one, two), (two, one))]
        try:
            runs = (
                self._go(each, code, stdin, limits, grant)
                for each, (code, stdin) in zip(started, programs, strict=True)
            )
            return list(await asyncio.gather(*runs))
        finally:
            for task in relays:
                task.cancel()
            await asyncio.gather(*relays, return_exceptions=True)

    async def _fill(self) -> None:
        while len(self._ready) < self.warm and not self._closed:
            try:
                started = await self._start(self.limits)
            except (OSError, subprocess.SubprocessError):  # e.g. a preexec_fn step refused (unshare)
                log.warning("starting a warm sandbox process failed; the next run retries", exc_info=True)
                return
            if self._closed:
                await self._end(started)
                return
            self._ready.append(started)

    async def _start(self, limits: Limits) -> _Started:
        slot = await self._slots.get()
        uid = self.uid_base + slot
        workdir = tempfile.mkdtemp(prefix="treadle-sbx-", dir=self.workroot)
        ruleset = -1
        channel = channel_mod.open_channel()
        try:
            if self.own_uids:
                os.chown(workdir, uid, uid)
            env = {"PATH": "/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir}
            env.update(PYTHONDONTWRITEBYTECODE="1", LANG="C.UTF-8")
            confined = None
            if self.confinement is not None:
                prefix = os.path.dirname(os.path.dirname(self.python))
                ruleset = self.confinement.ruleset(workdir, [prefix])
                confined = self.confinement.child_setup(ruleset)
            namespaces = self.isolation == "namespaces"
            setup = _child_setup(limits, uid if self.own_uids else None, namespaces, confined)
            proc = await asyncio.create_subprocess_exec(
                self.python, "-I", "-c", _BOOTSTRAP,
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, cwd=workdir, env=env, start_new_session=True,
                preexec_fn=setup, pass_fds=(channel.child_in, channel.child_out),
            )  # fmt: skip
        except BaseException:
            shutil.rmtree(workdir, ignore_errors=True)
            self._slots.put_nowait(slot)
            channel.close()
            raise
        finally:
            channel_mod.close_child_ends(channel)
            if ruleset >= 0:
                os.close(ruleset)
        return _Started(proc, workdir, slot, channel)

    async def _go(
        self, started: _Started, code: str, stdin: str, limits: Limits, grant: cores_mod.Grant | None
    ) -> Result:
        begun = time.monotonic()
        main = os.path.join(started.workdir, "main.py")
        # A few kilobytes into a fresh tmpfs/disk directory; not worth a thread hop.
        with open(main, "w") as f:  # noqa: ASYNC230
            f.write(code)
        if self.own_uids:
            os.chown(main, self.uid_base + started.slot, self.uid_base + started.slot)
        variables = started.channel.variables
        if grant is not None:
            variables.update(dict.fromkeys((GRANTED_CORES, *THREAD_VARS), str(grant.units)))
            with contextlib.suppress(ProcessLookupError):  # it died starting: its status says why
                os.sched_setaffinity(started.proc.pid, grant.cores)
        line = GO + json.dumps(variables).encode() + b"\n"
        status, out, err = await self._collect(started.proc, line + stdin.encode(), limits)
        code_ = started.proc.returncode
        if status is None:
            status = _classify(code_, err)
        return Result(
            status=status, exit_code=code_, stdout=out.decode(errors="replace"),
            stderr=err.decode(errors="replace"), wall_s=time.monotonic() - begun,
            isolation=self.isolation,
        )  # fmt: skip

    async def _end(self, started: _Started) -> None:
        """Kill every process of the run, remove its directory, free its uid."""
        try:
            if self.own_uids:
                reaping.kill_uid(self.uid_base + started.slot)
                await reaping.reap_uid(self.uid_base + started.slot)
            else:
                reaping.terminate(started.proc)
            if started.proc.returncode is None:
                await reaping.reap(started.proc)
        finally:
            started.channel.close()
            shutil.rmtree(started.workdir, ignore_errors=True)
            self._slots.put_nowait(started.slot)

    async def _collect(
        self, proc: asyncio.subprocess.Process, stdin: bytes, limits: Limits
    ) -> tuple[Status | None, bytes, bytes]:
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        out, err = bytearray(), bytearray()
        overflow = asyncio.Event()

        async def drain(stream: asyncio.StreamReader, buf: bytearray) -> None:
            while chunk := await stream.read(65536):
                buf.extend(chunk)
                if len(out) + len(err) > limits.max_output_bytes:
                    overflow.set()
                    return

        async def feed() -> None:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                proc.stdin.write(stdin)  # type: ignore[union-attr]
                await proc.stdin.drain()  # type: ignore[union-attr]
                proc.stdin.close()  # type: ignore[union-attr]

        readers: asyncio.Future[Any] = asyncio.gather(
            drain(proc.stdout, out), drain(proc.stderr, err), feed(), proc.wait()
        )
        overflowed: asyncio.Future[Any] = asyncio.ensure_future(overflow.wait())
        done, _ = await asyncio.wait(
            {readers, overflowed}, timeout=limits.wall_s, return_when="FIRST_COMPLETED"
        )
        status: Status | None = None
        if readers not in done:
            status = "output_limit" if overflowed in done else "timeout"
            reaping.terminate(proc)
            readers.cancel()
            with contextlib.suppress(asyncio.CancelledError, ProcessLookupError):
                await readers
            await reaping.reap(proc)
        overflowed.cancel()
        cap = limits.max_output_bytes
        return status, bytes(out[:cap]), bytes(err[:cap])


def _classify(returncode: int | None, stderr: bytes) -> Status:
    if returncode == 0:
        return "ok"
    if returncode in (-signal.SIGXCPU, -signal.SIGKILL) or b"CPU time limit" in stderr:
        return "cpu_limit"
    if b"MemoryError" in stderr:
        return "memory_limit"
    return "error"


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    return ctypes.CDLL(name, use_errno=True) if name else None


def _child_setup(
    limits: Limits, uid: int | None, namespaces: bool, confined: Callable[[], None] | None
) -> Callable[[], None]:
    """The pre-exec hook: namespaces (with CAP_SYS_ADMIN), rlimits, the run's own uid, then Landlock
    and seccomp (``confined``)."""
    libc = _libc() if namespaces else None

    def setup() -> None:
        if libc is not None:
            if libc.unshare(CLONE_NEWNET | CLONE_NEWNS) != 0:
                raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNET|CLONE_NEWNS) failed")
            libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None)
            for path in (b"/tmp", b"/var/tmp", b"/dev/shm"):
                if os.path.isdir(path):
                    libc.mount(b"tmpfs", path, b"tmpfs", MS_NOSUID | MS_NODEV, b"size=16m,mode=1777")
        for res, value in (
            (resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s + 1)),
            (resource.RLIMIT_AS, (limits.memory_bytes, limits.memory_bytes)),
            (resource.RLIMIT_NPROC, (limits.max_processes, limits.max_processes)),
            (resource.RLIMIT_FSIZE, (limits.max_file_bytes, limits.max_file_bytes)),
            (resource.RLIMIT_NOFILE, (64, 64)),
            (resource.RLIMIT_CORE, (0, 0)),
        ):
            if res == resource.RLIMIT_NPROC and uid is None:
                continue  # without a uid of its own the limit would count the service's processes too
            resource.setrlimit(res, value)
        if uid is not None:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
        if confined is not None:
            confined()

    return setup
