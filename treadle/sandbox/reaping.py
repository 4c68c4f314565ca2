"""Ending a sandboxed run for good: kill and reap its processes, those that left its process group too;
used by ``runner.Sandbox``."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal

REAP_TIMEOUT_S = 10.0
"""How long a killed run's pipes and exit status are awaited before giving up on them."""


async def reap(proc: asyncio.subprocess.Process) -> None:
    """Wait for a killed process. On Python 3.11 Process.wait() resolves only once the pipes have
    closed as well, and a pipe nobody reads stays paused short of EOF: read what is left (discarded)
    so both pipes see EOF, then wait. Both steps are bounded so a stray holder of a pipe cannot hang us."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(discard_until_eof(proc), REAP_TIMEOUT_S)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(proc.wait(), REAP_TIMEOUT_S)


async def discard_until_eof(proc: asyncio.subprocess.Process) -> None:
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            while await stream.read(65536):
                pass


def terminate(proc: asyncio.subprocess.Process) -> None:
    """SIGKILL the run's process group, and the process itself should it have left the group (not
    once reaped: its pid may be another's by then)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)


def kill_uid(uid: int) -> None:
    """SIGKILL every process of ``uid``: a forked child takes the uid and calls ``kill(-1)``."""
    for _ in range(3):
        pid = os.fork()
        if pid == 0:  # child: only syscalls, then _exit
            try:
                os.setgid(uid)
                os.setuid(uid)
                os.kill(-1, signal.SIGKILL)
            except OSError:
                pass
            os._exit(0)
        os.waitpid(pid, 0)


async def reap_uid(uid: int, *, attempts: int = 50) -> None:
    """Wait for the killed processes of ``uid`` that were re-parented to us (we are their subreaper).

    Only pids this process never spawned are waited for, so asyncio's own child watcher (which waits
    on the pids it started) is not disturbed.
    """
    me = os.getpid()
    for _ in range(attempts):
        left = 0
        for pid, ppid in processes_of(uid):
            if ppid != me:
                left += 1
                continue
            with contextlib.suppress(ChildProcessError):
                if os.waitpid(pid, os.WNOHANG)[0] == 0:  # noqa: ASYNC222 (WNOHANG never blocks)
                    left += 1
        if left == 0:
            return
        await asyncio.sleep(0.01)


def processes_of(uid: int) -> list[tuple[int, int]]:
    """(pid, parent pid) of every process whose real uid is ``uid``."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            continue
        if int(fields.get("Uid", "-1").split()[0]) == uid:
            found.append((int(entry.name), int(fields.get("PPid", "0").strip())))
    return found
