"""A real ``redis-server`` (Debian package) on a free loopback port, without persistence; with
``password``, its default user requires it (``--requirepass``, as the chart's Redis)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

from treadle.testing import procs


@dataclass(frozen=True)
class RedisServer:
    host: str
    port: int
    pid: int
    password: str | None = None

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"


@contextlib.contextmanager
def redis_server(
    timeout: float = 15.0, *, password: str | None = None, port: int | None = None
) -> Iterator[RedisServer]:
    """``port``: this one (a restart on the port a stopped server had), else a free one."""
    binary = procs.which("redis-server", "apt-get install redis-server, or run hack/setup.sh")
    port = port or procs.free_port()
    argv = [
        binary, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no",
        "--protected-mode", "yes", "--daemonize", "no", *(["--requirepass", password] if password else []),
    ]  # fmt: skip
    with procs.running("redis-server", argv, lambda: procs.port_open(port), timeout=timeout) as proc:
        yield RedisServer("127.0.0.1", port, proc.pid, password)
