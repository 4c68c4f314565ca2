"""Start a server process on a free loopback port and wait until it answers."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

_REAPER = """
import os, signal, sys, time
parent, group = int(sys.argv[1]), int(sys.argv[2])
while os.getppid() == parent:
    time.sleep(0.2)
for sig, wait in ((signal.SIGTERM, 2.0), (signal.SIGKILL, 0.0)):
    try:
        os.killpg(group, sig)
    except ProcessLookupError:
        break
    time.sleep(wait)
"""
"""Run beside a server: once its parent (the test) is gone, SIGTERM then SIGKILL the server's group."""


class ServerFailed(RuntimeError):
    """A local server could not be started; the message names the binary and shows its log."""


_handed_out: set[int] = set()
_pick = random.SystemRandom()  # not the global generator, which hypothesis seeds in its tests


def free_port() -> int:
    """A TCP port that was free on 127.0.0.1 a moment ago, below the ephemeral range (no client's
    connection can take it meanwhile), random (test processes running side by side rarely pick the
    same), and never handed out twice by one process."""
    low, _ = _ephemeral_range()
    for _ in range(1000):
        port = _pick.randrange(10000, max(low, 10001))
        if port in _handed_out:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise ServerFailed("no free TCP port below the ephemeral range on 127.0.0.1")


def _ephemeral_range() -> tuple[int, int]:
    """Linux's ephemeral ports: a port the kernel picks (``bind(0)``) lies there, where any outgoing
    connection can take it before the server binds it."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.2)
        return s.connect_ex((host, port)) == 0


def which(binary: str, hint: str) -> str:
    """Absolute path of ``binary`` or a ServerFailed naming how to install it."""
    found = shutil.which(binary)
    if found is None:
        raise ServerFailed(f"{binary}: not found on PATH ({hint})")
    return found


@contextlib.contextmanager
def running(
    name: str,
    argv: Sequence[str],
    ready: Callable[[], bool],
    *,
    env: dict[str, str] | None = None,
    timeout: float = 30.0,
) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``argv`` until the block exits; ``ready`` is polled until True or ``timeout``."""
    with tempfile.TemporaryDirectory(prefix=f"treadle-{name}-") as tmp:
        log_path = Path(tmp) / "log"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                list(argv), stdout=log, stderr=subprocess.STDOUT, cwd=tmp,
                env={**os.environ, **(env or {})}, start_new_session=True,
            )  # fmt: skip
            reaper = reap_when_orphaned(proc.pid)
            try:
                deadline = time.monotonic() + timeout
                while not ready():
                    if proc.poll() is not None:
                        raise ServerFailed(f"{name} exited with {proc.returncode}: {_tail(log_path)}")
                    if time.monotonic() > deadline:
                        raise ServerFailed(f"{name} not ready after {timeout}s: {_tail(log_path)}")
                    time.sleep(0.05)
                yield proc
            finally:
                stop(proc)
                reaper.kill()
                reaper.wait()


def reap_when_orphaned(group: int) -> subprocess.Popen[bytes]:
    """A watchdog that stops process group ``group`` once this process is gone.

    A test killed by its timeout (or by hand) never runs ``stop``, and a server in a session of its
    own (vLLM with its EngineCore and workers, Redis) would outlive it, holding ports, memory and
    CPU. The watchdog, in a session of its own too, notices its parent change and stops the group.
    """
    return subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", _REAPER, str(os.getpid()), str(group)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip


def stop(proc: subprocess.Popen[bytes], grace: float = 5.0) -> None:
    """SIGTERM to the server's process group, then SIGKILL after ``grace`` seconds.

    The whole group, because servers such as vLLM leave worker processes (EngineCore, Worker)
    behind when only their leader is signalled; ``running`` starts each server in its own session.
    """
    if proc.poll() is None:
        _signal_group(proc, signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            _signal_group(proc, signal.SIGKILL)
            proc.wait()
    _signal_group(proc, signal.SIGKILL)  # children that outlived their leader


def _signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    """Signal ``proc``'s group if it leads one (started with a session of its own), else ``proc``."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if os.getpgid(proc.pid) == proc.pid:
            os.killpg(proc.pid, sig)
        elif proc.poll() is None:
            proc.send_signal(sig)


def _tail(path: Path, n: int = 2000) -> str:
    return path.read_text(errors="replace")[-n:]
