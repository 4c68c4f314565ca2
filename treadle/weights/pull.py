"""Read a published weight version whole, or not at all.

Called by inference-side loaders (the vLLM worker extension, local-mode trainers' peers) and
benchmarks. ``Reader.pull(version)`` reads the manifest (a version without one does not exist),
fetches every bucket into one buffer, checks each bucket's size and xxh3-128 digest against the
manifest, and only then builds the state dict as zero-copy views into that buffer. Any failure
raises before a single tensor is handed out, so callers never see a mixed or partial version.
``prefetch`` runs the same pull on a background thread so it can overlap generation.

The buffer comes from the reader's ``allocate``: ``pageable`` (plain numpy memory) by default, or
``pinned`` (page-locked, from torch's pinned host allocator) for a reader that feeds a CUDA engine:
the driver stages a host-to-device copy from pageable memory through a pinned bounce buffer of its
own, and ``Loader.apply`` took 6x as long from it (0.247 s vs 0.041 s for 2 GB on an H200,
bench/reports/weights-gpu.md).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import importlib
import logging
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from treadle import errors
from treadle.weights import layout, objects, tensors

log = logging.getLogger(__name__)

# How far past HEAD ``latest_version`` probes for manifests committed after the last HEAD write.
_PROBE_AHEAD = 64
# Re-reads of a bucket whose digest mismatched before the version is declared corrupt (another
# replica may hold good bytes).
_CORRUPT_RETRIES = 2


def latest_version(store: objects.ObjectStore, prefix: str) -> int | None:
    """The newest committed version under ``prefix``, or None if there is none.

    HEAD is read first and trusted only as a lower bound: a publisher killed after committing a
    manifest but before moving HEAD leaves it behind, so the next manifests are probed too.
    """
    raw = store.get(layout.head_key(layout.check_prefix(prefix)))
    try:
        head = int(raw) if raw is not None else None
    except ValueError:
        head = None
    if head is None:
        # No HEAD yet (the first publisher died right after its first commit): versions need not
        # start at 0, so look at the whole first probe window.
        found = [v for v in range(_PROBE_AHEAD) if store.exists(layout.manifest_key(prefix, v))]
        return found[-1] if found else None
    latest = head if store.exists(layout.manifest_key(prefix, head)) else None
    for v in range(head + 1, head + 1 + _PROBE_AHEAD):
        if not store.exists(layout.manifest_key(prefix, v)):
            break
        latest = v
    return latest


Allocate = Callable[[int], objects.Bytes]
"""Returns a writable 1-D uint8 array of (at least) the given number of bytes, every page touched."""


def pageable(nbytes: int) -> objects.Bytes:
    """Plain numpy memory, touched now: first-touch page faults cost up to seconds per GiB on VMs,
    and inside a transfer they count against Mooncake's read lease (default_kv_lease_ttl, 10 s),
    after which the read fails with LEASE_EXPIRED."""
    buffer = np.empty(nbytes, dtype=np.uint8)
    buffer.fill(0)
    return buffer


def pinned(nbytes: int) -> objects.Bytes:
    """Page-locked memory when torch has CUDA, else ``pageable(nbytes)``.

    A numpy view of ``torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)``; the view's
    ``base`` is that tensor, so the memory lives exactly as long as the view or any slice of it.
    Page-locking maps every page when the memory is allocated, so unlike ``pageable`` it needs no
    touch. torch's caching host allocator serves it (from any thread: it allocates in the context
    of the device the process already uses, pytorch#21081) and rounds the size up to a power of two;
    a freed buffer stays cached and pinned for the next allocation of the same size. Pinning fails
    (the host is out of page-lockable memory): logged, and the buffer is pageable.
    """
    try:
        torch = importlib.import_module("torch")
    except ImportError:
        return pageable(nbytes)
    if not torch.cuda.is_available():
        return pageable(nbytes)
    try:
        tensor = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    except RuntimeError as exc:
        log.warning("could not pin a %d-byte pull buffer, using pageable memory: %s", nbytes, exc)
        return pageable(nbytes)
    buffer: objects.Bytes = tensor.numpy()
    return buffer


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """One complete, validated version. ``tensors`` are views into ``buffer``."""

    version: int
    manifest: layout.Manifest
    tensors: dict[str, Any]
    buffer: objects.Bytes
    fetch_s: float
    """Wall time spent reading the manifest and every bucket, digests included."""
    storage: objects.Bytes | None = None
    """The whole array ``buffer`` is the front of (``out``, ``spare`` or a fresh allocation): hand it
    back as ``spare`` to reuse all of its capacity for a later, possibly larger, version."""


class Reader:
    """Pulls versions under one prefix from an ObjectStore."""

    def __init__(
        self,
        store: objects.ObjectStore,
        prefix: str,
        *,
        deadline_s: float = 30.0,
        on_bucket: Callable[[int, int], None] | None = None,  # (index, count) after each bucket; tests
        allocate: Allocate = pageable,
    ) -> None:
        self.store = store
        self.prefix = layout.check_prefix(prefix)
        self.deadline_s = deadline_s
        self.allocate = allocate
        """Makes a pull's buffer when none is given or the given ``spare`` is too small."""
        self._on_bucket = on_bucket
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="treadle-prefetch"
        )

    def latest(self) -> int | None:
        return latest_version(self.store, self.prefix)

    def manifest(self, version: int) -> layout.Manifest:
        """The manifest of a committed version; NotFound if it is not (or no longer) committed."""
        key = layout.manifest_key(self.prefix, layout.check_version(version))
        raw = objects.retrying(f"get {key}", lambda: self.store.get(key), deadline_s=self.deadline_s)
        if raw is None:
            raise errors.NotFound(f"version {version} is not committed under {self.prefix!r}")
        return layout.Manifest.from_json(raw, prefix=self.prefix, version=version)

    def pull(
        self,
        version: int,
        *,
        kind: tensors.Kind = "numpy",
        out: objects.Bytes | None = None,
        spare: objects.Bytes | None = None,
    ) -> Snapshot:
        """Every tensor of ``version``, validated; raises NotFound, CorruptVersion or Unavailable.

        ``out`` is a buffer to reuse (at least ``manifest.layout_bytes``, else SpecError). ``spare``
        is one to reuse if it is large enough; if it is not, it is dropped. Either way the
        snapshot's tensors are views into it, so the caller must be done with the previous snapshot.
        Without either (or with too small a ``spare``) the buffer comes from ``allocate``, which
        touches every page before any transfer (see ``pageable``, ``pinned``).
        """
        start = time.perf_counter()
        manifest = self.manifest(version)
        if out is not None and spare is not None:
            raise errors.SpecError("give out or spare, not both", field="spare")
        given = out if out is not None else spare
        if given is not None and (given.dtype != np.uint8 or given.ndim != 1):
            raise errors.SpecError("must be a 1-D uint8 array", field="out" if out is not None else "spare")
        if out is not None and out.nbytes < manifest.layout_bytes:
            raise errors.SpecError(
                f"must be a 1-D uint8 array of >= {manifest.layout_bytes} bytes", field="out"
            )
        if given is None or given.nbytes < manifest.layout_bytes:
            given = self.allocate(manifest.layout_bytes)
            if given.dtype != np.uint8 or given.ndim != 1 or given.nbytes < manifest.layout_bytes:
                raise errors.SpecError(
                    f"must return a 1-D uint8 array of >= {manifest.layout_bytes} bytes", field="allocate"
                )
        buffer = given[: manifest.layout_bytes]
        self.store.register(buffer)
        try:
            for i, (bucket, at) in enumerate(zip(manifest.buckets, manifest.bucket_offsets(), strict=True)):
                self._fetch(manifest, bucket, buffer[at : at + bucket.nbytes])
                if self._on_bucket is not None:
                    self._on_bucket(i, len(manifest.buckets))
        finally:
            self.store.unregister(buffer)
        fetched = time.perf_counter() - start
        return Snapshot(
            version, manifest, tensors.rebuild(manifest, buffer, kind=kind), buffer, fetched, storage=given
        )

    def _fetch(self, manifest: layout.Manifest, bucket: layout.BucketEntry, out: objects.Bytes) -> None:
        for _ in range(1 + _CORRUPT_RETRIES):
            try:
                objects.retrying(
                    f"get {bucket.key}",
                    lambda: self.store.get_into(bucket.key, out),
                    deadline_s=self.deadline_s,
                )
            except errors.NotFound as exc:
                if not self.store.exists(layout.manifest_key(self.prefix, manifest.version)):
                    raise errors.NotFound(f"version {manifest.version} was deleted while being read") from exc
                raise layout.CorruptVersion(
                    f"{bucket.key}: missing from committed version {manifest.version}"
                ) from exc
            if layout.digest(out) == bucket.xxh3_128:
                return
        raise layout.CorruptVersion(f"{bucket.key}: xxh3-128 digest does not match the manifest")

    def prefetch(
        self,
        version: int,
        *,
        kind: tensors.Kind = "numpy",
        out: objects.Bytes | None = None,
        spare: objects.Bytes | None = None,
    ) -> concurrent.futures.Future[Snapshot]:
        """``pull`` on a background thread (one at a time, in submission order)."""
        return self._pool.submit(self.pull, version, kind=kind, out=out, spare=spare)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
