"""A real ``mooncake_master`` (PyPI ``mooncake-transfer-engine-non-cuda``) on loopback.

The master embeds Mooncake's HTTP metadata server, so no etcd is needed. Clients must set
``MC_TCP_BIND_ADDRESS=127.0.0.1``; otherwise the TCP data lanes use the first non-loopback address.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from treadle.testing import procs

LOOPBACK_ENV = {"MC_TCP_BIND_ADDRESS": "127.0.0.1"}


@dataclass(frozen=True)
class MooncakeMaster:
    rpc_port: int
    metadata_port: int
    metrics_port: int
    pid: int

    @property
    def master_address(self) -> str:
        return f"127.0.0.1:{self.rpc_port}"

    @property
    def metadata_url(self) -> str:
        return f"http://127.0.0.1:{self.metadata_port}/metadata"


def master_binary() -> str:
    try:
        import mooncake
    except ImportError as exc:  # libibverbs missing shows up here too
        raise procs.ServerFailed(
            f"mooncake_master: cannot import mooncake ({exc}); pip install 'treadle[mooncake]' "
            "and apt-get install libibverbs1"
        ) from exc
    path = Path(mooncake.__file__).parent / "mooncake_master"
    if not os.access(path, os.X_OK):
        raise procs.ServerFailed(f"mooncake_master: {path} is missing or not executable")
    return str(path)


@contextlib.contextmanager
def mooncake_master(timeout: float = 30.0, client_ttl_s: int = 10) -> Iterator[MooncakeMaster]:
    rpc, meta, metrics = procs.free_port(), procs.free_port(), procs.free_port()
    argv = [
        master_binary(),
        f"--rpc_port={rpc}", "--rpc_address=127.0.0.1",
        "--enable_http_metadata_server=true", "--http_metadata_server_host=127.0.0.1",
        f"--http_metadata_server_port={meta}",
        "--metrics_host=127.0.0.1", f"--metrics_port={metrics}",
        f"--client_ttl={client_ttl_s}",
    ]  # fmt: skip
    ready = lambda: all(procs.port_open(p) for p in (rpc, meta))  # noqa: E731
    with procs.running("mooncake_master", argv, ready, env=LOOPBACK_ENV, timeout=timeout) as proc:
        yield MooncakeMaster(rpc, meta, metrics, proc.pid)
