"""Publish a state dict as a versioned set of checksummed buckets, committed by a manifest written last.

Called by the trainer SDK (``treadle.client.publisher``) and benchmarks. The protocol (RollArt
§6.3 buckets into a CPU-resident store, our commit rule from ARCHITECTURE.md):

1. validate the whole state dict before writing anything (bad input stores nothing);
2. pack tensors into buckets of ``bucket_bytes`` (ALIGN-aligned, never split), hash each with
   xxh3-128 and write it (``upsert``: a retry after a crash overwrites a half-written attempt);
3. only when every bucket is stored on every replica, create the manifest: the commit point.
   Before it exists the version does not exist for readers; a publisher killed in steps 1-2 leaves
   the previous version as the latest and the partial one invisible (and swept by ``gc``);
4. move the HEAD hint, then delete versions older than ``latest - staleness_window`` (manifest
   first, so no new reader starts on a version being deleted).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from treadle import errors
from treadle.weights import layout, objects, pull, tensors

log = logging.getLogger(__name__)

DEFAULT_BUCKET_BYTES = 1 << 30
"""RollArt publishes ~1 GB buckets; large enough that per-object overhead vanishes."""

# Versions below the latest that a restarted publisher looks for when it adopts old versions for gc.
_ADOPT_LOOKBACK = 16


@dataclasses.dataclass(frozen=True)
class Part:
    """Buckets one writer stored for a version, and the tensors (or parts of them) they hold."""

    buckets: tuple[layout.BucketEntry, ...]
    tensors: tuple[layout.TensorEntry, ...]


class Publisher:
    """Writes versions under one prefix; one Publisher per prefix at a time."""

    def __init__(
        self,
        store: objects.ObjectStore,
        prefix: str,
        *,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        staleness_window: int = 1,
        deadline_s: float = 30.0,
        clock: Callable[[], float] = time.time,
        on_bucket: Callable[[int, int], None] | None = None,  # (index, count) after each bucket; tests
    ) -> None:
        if bucket_bytes < layout.ALIGN:
            raise errors.SpecError(
                f"must be at least {layout.ALIGN}", field="bucket_bytes", value=bucket_bytes
            )
        if staleness_window < 0:
            raise errors.SpecError("must be >= 0", field="staleness_window", value=staleness_window)
        self.store = store
        self.prefix = layout.check_prefix(prefix)
        self.bucket_bytes = bucket_bytes
        self.staleness_window = staleness_window
        self.deadline_s = deadline_s
        self._clock = clock
        self._on_bucket = on_bucket
        self._staging: objects.Bytes | None = None
        # Keys of every version this publisher knows to exist, the manifest last.
        self._versions: dict[int, list[str]] = {}
        self.latest = pull.latest_version(store, prefix)
        if self.latest is not None:
            self._adopt(self.latest)
        self._sweep_uncommitted()

    def _sweep_uncommitted(self) -> None:
        """Delete buckets a publisher killed mid-publish left behind (versions with no manifest)."""
        start = -1 if self.latest is None else self.latest
        for v in range(start + 1, start + 1 + _ADOPT_LOOKBACK):
            if not self.store.exists(layout.manifest_key(self.prefix, v)):
                self.store.remove_dir(layout.version_dir(self.prefix, v))

    def _adopt(self, latest: int) -> None:
        """Remember committed versions a previous publisher left, so ``gc`` can delete them."""
        for v in range(max(0, latest - self.staleness_window - _ADOPT_LOOKBACK), latest + 1):
            raw = self.store.get(layout.manifest_key(self.prefix, v))
            if raw is None:
                continue
            try:
                keys = [b.key for b in layout.Manifest.from_json(raw, prefix=self.prefix, version=v).buckets]
            except layout.CorruptVersion:
                keys = []  # remove_dir sweeps its buckets
            self._versions[v] = [*keys, layout.manifest_key(self.prefix, v)]

    def publish(self, state_dict: Mapping[str, Any], version: int) -> layout.Manifest:
        """Store ``state_dict`` as ``version`` and commit it; returns the manifest written.

        Raises SpecError for bad input, Conflict if ``version`` is not newer than the latest
        committed one, Unavailable if the store cannot take the bytes before the deadline.
        """
        self._check_new(version)
        return self.commit_parts(version, [self.write_part(state_dict, version)])

    def plan_part(self, state_dict: Mapping[str, Any]) -> int:
        """How many buckets ``write_part`` will write for ``state_dict`` (validates it)."""
        flats = tensors.flatten(state_dict)
        return layout.plan_buckets([f.data.nbytes for f in flats], self.bucket_bytes)[-1][0] + 1

    def write_part(self, state_dict: Mapping[str, Any], version: int, *, first_bucket: int = 0) -> Part:
        """Write ``state_dict``'s buckets of ``version`` as buckets ``first_bucket`` on, no manifest.

        The ranks of a sharded trainer each write their part (``tensors.Shard`` values for their
        rows), numbered after the lower ranks' buckets (``plan_part``); one of them then commits
        every part with ``commit_parts``. Until then the version does not exist for readers.
        """
        layout.check_version(version)
        flats = tensors.flatten(state_dict)
        placements = layout.plan_buckets([f.data.nbytes for f in flats], self.bucket_bytes)
        count = placements[-1][0] + 1
        sizes = [0] * count
        for f, (b, off) in zip(flats, placements, strict=True):
            sizes[b] = max(sizes[b], off + f.data.nbytes)
        staging = self._staging_buffer(max(sizes))
        # Registered per publish, not once: a buffer left registered after its Publisher is gone
        # makes the next registration at a reused address fail ("overlapped memory region").
        self.store.register(staging)
        try:
            buckets, entries = self._write_buckets(flats, placements, sizes, version, staging, first_bucket)
        finally:
            self.store.unregister(staging)
        return Part(tuple(buckets), tuple(entries))

    def commit_parts(self, version: int, parts: Sequence[Part]) -> layout.Manifest:
        """Write the manifest of ``version`` over ``parts`` (in bucket order): the commit point.

        CorruptVersion (nothing committed) when the parts' buckets are not numbered one after another
        or their tensors do not tile; Conflict as ``publish``."""
        self._check_new(version)
        buckets = tuple(b for part in parts for b in part.buckets)
        entries = tuple(t for part in parts for t in part.tensors)
        manifest = layout.Manifest(version, self.prefix, buckets, entries, self._clock())
        layout.Manifest.from_json(manifest.to_json(), prefix=self.prefix, version=version)  # consistent?
        manifest_key = layout.manifest_key(self.prefix, version)
        self._versions[version] = [*(b.key for b in buckets), manifest_key]
        created = objects.retrying(
            f"commit {manifest_key}",
            lambda: self.store.create(manifest_key, manifest.to_json()),
            deadline_s=self.deadline_s,
        )
        if not created:
            raise errors.Conflict(f"version {version} was committed by someone else while publishing")
        self.latest = version
        try:
            self.store.put(layout.head_key(self.prefix), str(version).encode())
        except errors.Unavailable as exc:  # HEAD is a hint; readers probe past it
            log.warning("published v%d but could not move HEAD: %s", version, exc)
        self.gc()
        return manifest

    def _check_new(self, version: int) -> None:
        layout.check_version(version)
        if self.latest is not None and version <= self.latest:
            raise errors.Conflict(
                f"version {version} is not newer than the latest committed version {self.latest}"
            )
        if self.store.exists(layout.manifest_key(self.prefix, version)):
            raise errors.Conflict(f"version {version} is already committed under {self.prefix!r}")

    def _write_buckets(
        self,
        flats: list[tensors.Flat],
        placements: list[tuple[int, int]],
        sizes: list[int],
        version: int,
        staging: objects.Bytes,
        first_bucket: int,
    ) -> tuple[list[layout.BucketEntry], list[layout.TensorEntry]]:
        """Pack, hash and store every bucket in order; the manifest entries that describe them."""
        buckets: list[layout.BucketEntry] = []
        entries: list[layout.TensorEntry] = []
        first = 0
        for b, size in enumerate(sizes):
            view = staging[:size]
            end = first
            cursor = 0
            while end < len(flats) and placements[end][0] == b:
                f, off = flats[end], placements[end][1]
                view[cursor:off] = 0  # alignment gaps: deterministic bytes, deterministic digest
                view[off : off + f.data.nbytes] = f.data
                cursor = off + f.data.nbytes
                entries.append(
                    layout.TensorEntry(f.name, f.dtype, f.shape, first_bucket + b, off, f.data.nbytes, f.rows)
                )
                end += 1
            first = end
            key = layout.bucket_key(self.prefix, version, first_bucket + b)
            buckets.append(layout.BucketEntry(key, size, layout.digest(view)))
            objects.retrying(f"put {key}", lambda: self.store.put(key, view), deadline_s=self.deadline_s)  # noqa: B023
            if self._on_bucket is not None:
                self._on_bucket(b, len(sizes))
        return buckets, entries

    def _staging_buffer(self, size: int) -> objects.Bytes:
        """One reusable packing buffer: fresh memory costs first-touch page faults on every publish."""
        if self._staging is None or self._staging.nbytes < size:
            self._staging = np.empty(size, dtype=np.uint8)
        return self._staging

    def gc(self) -> list[int]:
        """Delete versions older than ``latest - staleness_window``; returns those still pending.

        A version whose keys the store refuses to remove yet stays pending, and the next publish
        (or gc call) tries again.
        """
        if self.latest is None:
            return []
        pending = []
        for v in sorted(self._versions):
            if v >= self.latest - self.staleness_window:
                continue
            if self._delete(v):
                del self._versions[v]
            else:
                pending.append(v)
        return pending

    def _delete(self, version: int) -> bool:
        keys = self._versions[version]
        manifest_key = keys[-1]
        if not self.store.remove(manifest_key):
            return False
        remaining = [k for k in keys[:-1] if not self.store.remove(k)]
        self.store.remove_dir(layout.version_dir(self.prefix, version))
        self._versions[version] = [*remaining, manifest_key]
        return not remaining

    def known_versions(self) -> list[int]:
        """Versions this publisher has not deleted yet, oldest first."""
        return sorted(self._versions)

    def close(self) -> None:
        """Drop the staging buffer (the store itself belongs to the caller)."""
        self._staging = None
