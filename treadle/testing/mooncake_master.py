"""A real ``mooncake_master`` (PyPI ``mooncake-transfer-engine-non-cuda``) on loopback.

Segment metadata goes to Mooncake's own HTTP metadata server (no etcd needed), started as a
process of its own: the copy embedded in the master ignores ``--http_metadata_server_host`` and
listens on every interface. Clients must set ``MC_TCP_BIND_ADDRESS=127.0.0.1``; otherwise the TCP
data lanes use the first non-loopback address. (Mooncake clients still listen on all interfaces
for their transfer-engine ports; nothing in Treadle sends them traffic beyond loopback.)
"""

from __future__ import annotations

import contextlib
import os
import sys
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
def mooncake_master(
    timeout: float = 30.0, client_ttl_s: int = 10, lease_ttl_ms: int = 10_000
) -> Iterator[MooncakeMaster]:
    """Master plus metadata server; ``lease_ttl_ms`` is how long a read pins an object against removal."""
    rpc, meta, metrics = procs.free_port(), procs.free_port(), procs.free_port()
    metadata_argv = [
        sys.executable, "-m", "mooncake.http_metadata_server", "--host", "127.0.0.1", "--port", str(meta),
    ]  # fmt: skip
    master_argv = [
        master_binary(),
        f"--rpc_port={rpc}", "--rpc_address=127.0.0.1",
        "--metrics_host=127.0.0.1", f"--metrics_port={metrics}",
        f"--client_ttl={client_ttl_s}", f"--default_kv_lease_ttl={lease_ttl_ms}",
    ]  # fmt: skip
    with (
        procs.running(
            "mooncake_http_metadata_server", metadata_argv, lambda: procs.port_open(meta), timeout=timeout
        ),
        procs.running(
            "mooncake_master", master_argv, lambda: procs.port_open(rpc), env=LOOPBACK_ENV, timeout=timeout
        ) as proc,
    ):
        yield MooncakeMaster(rpc, meta, metrics, proc.pid)
