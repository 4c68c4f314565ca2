"""An ObjectStore on Mooncake Store, as a pure client: it never lends its own memory to the pool.

Used by the trainer's publisher and by inference-side readers in a cluster; the bytes live in
dedicated store processes (``treadle.weights.store``) that mount segments, with ``replicas`` copies
on distinct segments, hard-pinned (never evicted: old versions are removed explicitly).

Mooncake reports errors as integer return codes, never exceptions, and returns ``b''`` for a missing
key as well as for a failed transfer; every call here checks its code and maps it onto the
ObjectStore contract (NotFound / CorruptVersion / Unavailable). Two behaviours measured on 0.3.13
shape this module: ``put`` on an existing key returns 0 and silently keeps the old bytes (so buckets
use ``upsert``), and ``replica_num`` is best effort (asking for 3 replicas with 2 segments succeeds
with 2), so every put counts the replicas it got.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import re
from typing import Any

from treadle import errors
from treadle.weights import layout, objects

# Return codes seen from mooncake.store 0.3.13 (others are reported by number).
RC_BUFFER = -600  # user buffer too small, or no space left in any segment
RC_NOT_FOUND = -704
RC_HAS_LEASE = -706  # read within the master's default_kv_lease_ttl; removable later
RC_LEASE_EXPIRED = -707  # a read outlasted its lease (slow transfer); retrying may succeed
RC_TRANSFER_FAIL = -800
_RC_NAMES = {RC_BUFFER: "BUFFER_OR_SPACE", RC_NOT_FOUND: "OBJECT_NOT_FOUND", RC_HAS_LEASE: "OBJECT_HAS_LEASE",
             RC_LEASE_EXPIRED: "LEASE_EXPIRED",
             RC_TRANSFER_FAIL: "TRANSFER_FAIL"}  # fmt: skip


def rc_name(rc: int) -> str:
    return f"{_RC_NAMES.get(rc, 'rc')} ({rc})"


@dataclasses.dataclass(frozen=True)
class MooncakeConfig:
    master_address: str
    """host:port of mooncake_master's RPC endpoint."""
    metadata_url: str
    """Transfer-engine metadata service, e.g. the master's embedded http://host:port/metadata."""
    local_hostname: str = "127.0.0.1"
    """Address this process announces to peers."""
    protocol: str = "tcp"
    replicas: int = 2
    """Copies of every object, each on a distinct store segment; fewer is an error, not a warning."""
    local_buffer_bytes: int = 16 << 20
    """Client-side staging buffer for non-zero-copy puts/gets (manifest, HEAD)."""
    bind_address: str | None = "127.0.0.1"
    """Exported as MC_TCP_BIND_ADDRESS before setup; without it TCP lanes use the first non-loopback
    address even when local_hostname is 127.0.0.1. None leaves the environment alone."""

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise errors.SpecError("must be >= 1", field="replicas", value=self.replicas)


def connect(config: MooncakeConfig, *, segment_bytes: int) -> Any:
    """A set-up ``MooncakeDistributedStore`` that mounts ``segment_bytes`` of this process (0: none)."""
    if config.bind_address is not None:
        os.environ["MC_TCP_BIND_ADDRESS"] = config.bind_address
    try:
        store_mod = importlib.import_module("mooncake.store")
    except ImportError as exc:
        raise errors.Unavailable(
            f"mooncake is not importable ({exc}); "
            "pip install 'treadle[mooncake]' and apt-get install libibverbs1"
        ) from exc
    client = store_mod.MooncakeDistributedStore()
    rc = client.setup(
        config.local_hostname, config.metadata_url, segment_bytes, config.local_buffer_bytes,
        config.protocol, "", config.master_address,
    )  # fmt: skip
    if rc != 0:
        raise errors.Unavailable(
            f"mooncake setup against master {config.master_address} failed: {rc_name(rc)}"
        )
    return client


class MooncakeStore:
    """ObjectStore over Mooncake Store; this process mounts no segment (global_segment_size=0)."""

    def __init__(self, config: MooncakeConfig) -> None:
        self.config = config
        self._client = connect(config, segment_bytes=0)
        store_mod = importlib.import_module("mooncake.store")
        self._replicate = store_mod.ReplicateConfig()
        self._replicate.replica_num = config.replicas
        self._replicate.with_hard_pin = True
        self._complete = store_mod.ReplicaStatus.COMPLETE
        self._registered: dict[int, int] = {}  # start address -> size

    def _is_registered(self, buf: objects.Bytes) -> bool:
        addr = buf.ctypes.data
        return any(
            start <= addr and addr + buf.nbytes <= start + size for start, size in self._registered.items()
        )

    def register(self, buf: objects.Bytes) -> None:
        rc = self._client.register_buffer(buf.ctypes.data, buf.nbytes)
        if rc != 0:
            raise errors.Unavailable(f"mooncake register_buffer({buf.nbytes} bytes) failed: {rc_name(rc)}")
        self._registered[buf.ctypes.data] = buf.nbytes

    def unregister(self, buf: objects.Bytes) -> None:
        if self._registered.pop(buf.ctypes.data, None) is not None:
            rc = self._client.unregister_buffer(buf.ctypes.data)
            if rc != 0:
                raise errors.Unavailable(f"mooncake unregister_buffer failed: {rc_name(rc)}")

    def put(self, key: str, data: objects.Bytes | bytes) -> None:
        if isinstance(data, bytes) or not self._is_registered(data):
            rc = self._client.upsert(key, data if isinstance(data, bytes) else data.data, self._replicate)
        else:
            rc = self._client.upsert_from(key, data.ctypes.data, data.nbytes, self._replicate)
        if rc != 0:
            raise errors.Unavailable(f"{key}: mooncake upsert failed: {rc_name(rc)}")
        self._check_replicas(key)

    def _check_replicas(self, key: str) -> None:
        replicas = self._client.get_replica_desc(key)
        complete = sum(1 for r in replicas if r.status == self._complete)
        if complete < self.config.replicas:
            raise errors.Unavailable(
                f"{key}: {complete} complete replica(s), {self.config.replicas} required "
                "(too few store segments?)"
            )

    def create(self, key: str, data: bytes) -> bool:
        # Not atomic across writers: one publisher per prefix is the contract.
        if self.exists(key):
            return False
        rc = self._client.put(key, data, self._replicate)
        if rc != 0:
            raise errors.Unavailable(f"{key}: mooncake put failed: {rc_name(rc)}")
        self._check_replicas(key)
        return True

    def get(self, key: str) -> bytes | None:
        data: bytes = self._client.get(key)
        if data:
            return data
        # b'' is both "missing" and "transfer failed"; only the master knows which.
        if self.exists(key):
            raise errors.Unavailable(f"{key}: exists but could not be read (a store segment down?)")
        return None

    def get_into(self, key: str, out: objects.Bytes) -> None:
        temporary = not self._is_registered(out)
        if temporary:
            self.register(out)
        try:
            rc = self._client.get_into(key, out.ctypes.data, out.nbytes)
        finally:
            if temporary:
                self.unregister(out)
        if rc == out.nbytes:
            return
        if rc == RC_NOT_FOUND:
            raise errors.NotFound(f"{key}: not in the store")
        size = self._client.get_size(key) if rc == RC_BUFFER else rc
        if size >= 0:
            raise layout.CorruptVersion(f"{key}: {size} bytes stored, manifest says {out.nbytes}")
        raise errors.Unavailable(f"{key}: mooncake get_into failed: {rc_name(rc)}")

    def exists(self, key: str) -> bool:
        rc = self._client.is_exist(key)
        if rc < 0:
            raise errors.Unavailable(f"{key}: mooncake is_exist failed: {rc_name(rc)}")
        return bool(rc == 1)

    # Removal is forced past leases: any access (even is_exist or get_replica_desc) leases an object
    # for the master's default_kv_lease_ttl (10 s), which would keep every just-published version
    # alive. Forcing is safe here because readers check every bucket's digest: one racing with the
    # deletion of a version fails its pull instead of returning mixed bytes.
    def remove(self, key: str) -> bool:
        rc = self._client.remove(key, force=True)
        if rc in (0, RC_NOT_FOUND):
            return True
        if rc == RC_HAS_LEASE:
            return False
        raise errors.Unavailable(f"{key}: mooncake remove failed: {rc_name(rc)}")

    def remove_dir(self, prefix: str) -> None:
        rc = self._client.remove_by_regex("^" + re.escape(prefix + "/"), force=True)
        if rc < 0:
            raise errors.Unavailable(f"{prefix}/: mooncake remove_by_regex failed: {rc_name(rc)}")

    def close(self) -> None:
        for start in list(self._registered):
            self._client.unregister_buffer(start)
        self._registered.clear()
        self._client.close()
