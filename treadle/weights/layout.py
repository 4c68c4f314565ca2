"""Where a weight version lives in a store, and its manifest: the version's commit record.

Used by the publisher (which writes buckets, then the manifest last) and by readers (which trust
nothing a manifest does not vouch for). Keys for version ``v`` under a job prefix ``p``::

    p/v000000000042/bucket00000 ... bucketNNNNN    raw bytes, tensors packed 256-byte aligned
    p/v000000000042/MANIFEST                       JSON below, written only after every bucket
    p/HEAD                                         latest committed version (a hint, see below)

A single-agent job publishes under its prefix itself; a multi-agent job (FlexMARL) publishes each
agent's versions under ``p/<agent>`` (``agent_prefix``), so an engine that moves between agents
reads the receiver's versions, numbered on their own. In a cluster ``p`` is what the operator
renders as ``TREADLE_WEIGHTS_PREFIX`` (``<namespace>/<job>/<uid>``: a re-created job starts empty).

The manifest names every bucket with its size and xxh3-128 digest and every tensor with its bucket,
offset, dtype and shape; it carries a digest of its own canonical JSON so a damaged manifest is
rejected too. A trainer whose ranks hold shards (FSDP) publishes each rank's rows of a tensor as a
part (``TensorEntry.rows``): the ranks write their own buckets, numbered one after another, and rank
0 writes the manifest listing every part; readers assemble the parts. HEAD is written after the
manifest and is only a hint for ``latest``: a publisher that dies between the two leaves HEAD one
behind, which readers repair by probing the next manifests.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Sequence
from typing import Any

import xxhash

from treadle import errors

FORMAT = "treadle.weights/1"
ALIGN = 256
"""Tensor offsets inside a bucket are multiples of this, so every tensor view is aligned."""

_PREFIX_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)*$")
_VERSION_DIGITS = 12


class CorruptVersion(errors.TreadleError):
    """A committed version whose bytes do not match its manifest; it must never be applied."""


def check_prefix(prefix: str) -> str:
    """A job prefix is slash-separated path segments; it becomes part of every key and of regexes."""
    if not _PREFIX_RE.match(prefix):
        raise errors.SpecError(
            "must be slash-separated segments of letters, digits, '.', '_' or '-'",
            field="prefix",
            value=prefix,
        )
    return prefix


def agent_prefix(prefix: str, agent: str) -> str:
    """Where ``agent``'s versions live in a multi-agent job whose prefix is ``prefix``."""
    if not agent or "/" in agent:
        raise errors.SpecError("must be one path segment (an agent's name)", field="agent", value=agent)
    return check_prefix(f"{prefix}/{agent}")


def check_version(version: int) -> int:
    if isinstance(version, bool) or not isinstance(version, int) or not 0 <= version < 10**_VERSION_DIGITS:
        raise errors.SpecError(
            f"must be an integer in [0, 1e{_VERSION_DIGITS})", field="version", value=version
        )
    return version


def version_dir(prefix: str, version: int) -> str:
    return f"{prefix}/v{version:0{_VERSION_DIGITS}d}"


def bucket_key(prefix: str, version: int, index: int) -> str:
    return f"{version_dir(prefix, version)}/bucket{index:05d}"


def manifest_key(prefix: str, version: int) -> str:
    return f"{version_dir(prefix, version)}/MANIFEST"


def head_key(prefix: str) -> str:
    return f"{prefix}/HEAD"


def digest(data: Any) -> str:
    """xxh3-128 of a bytes-like object (numpy arrays included), as hex."""
    return xxhash.xxh3_128_hexdigest(data)


def aligned(offset: int) -> int:
    return -(-offset // ALIGN) * ALIGN


@dataclasses.dataclass(frozen=True)
class TensorEntry:
    name: str
    dtype: str
    shape: tuple[int, ...]
    bucket: int
    offset: int
    nbytes: int
    rows: tuple[int, int] | None = None
    """A part of the tensor: rows ``[start, stop)`` of its first dimension (``shape`` is the whole
    tensor's). A trainer whose ranks hold shards publishes each rank's rows as its own entries; the
    parts of one name tile its first dimension exactly. None: the whole tensor."""

    @property
    def part_shape(self) -> tuple[int, ...]:
        """The shape of the bytes this entry holds."""
        if self.rows is None:
            return self.shape
        return (self.rows[1] - self.rows[0], *self.shape[1:])


@dataclasses.dataclass(frozen=True)
class BucketEntry:
    key: str
    nbytes: int
    xxh3_128: str


@dataclasses.dataclass(frozen=True)
class Manifest:
    version: int
    prefix: str
    buckets: tuple[BucketEntry, ...]
    tensors: tuple[TensorEntry, ...]
    published_at: float
    """Unix seconds when the last bucket was written (the publisher's clock)."""

    @property
    def total_bytes(self) -> int:
        return sum(b.nbytes for b in self.buckets)

    def bucket_offsets(self) -> list[int]:
        """Where each bucket starts when readers lay all buckets out in one buffer (ALIGN-aligned)."""
        out, at = [], 0
        for b in self.buckets:
            out.append(at)
            at = aligned(at + b.nbytes)
        return out

    @property
    def layout_bytes(self) -> int:
        """Size of the one buffer that holds every bucket at ``bucket_offsets``."""
        starts = self.bucket_offsets()
        return starts[-1] + self.buckets[-1].nbytes if self.buckets else 0

    def to_json(self) -> bytes:
        body = self._body()
        body["digest"] = digest(_canonical(body))
        return json.dumps(body, separators=(",", ":")).encode()

    def _body(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": self.version,
            "prefix": self.prefix,
            "published_at": self.published_at,
            "buckets": [dataclasses.asdict(b) for b in self.buckets],
            "tensors": [_tensor_body(t) for t in self.tensors],
        }

    @classmethod
    def from_json(cls, raw: bytes, *, prefix: str, version: int) -> Manifest:
        """Parse and check a manifest read from ``manifest_key(prefix, version)``.

        Raises CorruptVersion when it is damaged, for another version, or describes tensors that
        do not fit inside their buckets: such a version can never be applied.
        """
        try:
            body = json.loads(raw)
            claimed = body.pop("digest")
            if digest(_canonical(body)) != claimed:
                raise CorruptVersion(f"{manifest_key(prefix, version)}: manifest digest mismatch")
            manifest = cls(
                version=int(body["version"]),
                prefix=str(body["prefix"]),
                published_at=float(body["published_at"]),
                buckets=tuple(
                    BucketEntry(str(b["key"]), int(b["nbytes"]), str(b["xxh3_128"])) for b in body["buckets"]
                ),
                tensors=tuple(
                    TensorEntry(
                        name=str(t["name"]), dtype=str(t["dtype"]), shape=tuple(int(d) for d in t["shape"]),
                        bucket=int(t["bucket"]), offset=int(t["offset"]), nbytes=int(t["nbytes"]),
                        rows=(int(t["rows"][0]), int(t["rows"][1])) if "rows" in t else None,
                    )
                    for t in body["tensors"]
                ),
            )  # fmt: skip
            fmt = body["format"]
        except CorruptVersion:
            raise
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CorruptVersion(f"{manifest_key(prefix, version)}: unreadable manifest ({exc!r})") from exc
        if fmt != FORMAT:
            raise CorruptVersion(f"{manifest_key(prefix, version)}: format {fmt!r}, expected {FORMAT!r}")
        if manifest.version != version or manifest.prefix != prefix:
            raise CorruptVersion(
                f"{manifest_key(prefix, version)}: manifest is for {manifest.prefix!r} v{manifest.version}"
            )
        _check_consistent(manifest)
        return manifest


def _check_consistent(m: Manifest) -> None:
    where = manifest_key(m.prefix, m.version)
    for i, b in enumerate(m.buckets):
        if b.key != bucket_key(m.prefix, m.version, i) or b.nbytes < 0:
            raise CorruptVersion(f"{where}: bucket {i} is {b.key!r} with {b.nbytes} bytes")
    parts: dict[str, list[TensorEntry]] = {}
    for t in m.tensors:
        fits = (
            0 <= t.bucket < len(m.buckets)
            and t.offset >= 0
            and t.offset + t.nbytes <= m.buckets[t.bucket].nbytes
        )
        if not fits:
            raise CorruptVersion(f"{where}: tensor {t.name!r} lies outside its bucket")
        parts.setdefault(t.name, []).append(t)
    for name, entries in parts.items():
        if not tiles(entries):
            raise CorruptVersion(
                f"{where}: tensor {name!r} is duplicated, or its parts do not tile its first dimension"
            )


def tiles(entries: Sequence[TensorEntry]) -> bool:
    """Whether ``entries`` (all of one name) are one whole tensor, or parts covering every row once."""
    if len(entries) == 1 and entries[0].rows is None:
        return True
    first = entries[0]
    if any(e.rows is None or e.dtype != first.dtype or e.shape != first.shape for e in entries):
        return False
    if not first.shape:
        return False
    at = 0
    for e in sorted(entries, key=lambda e: e.rows or (0, 0)):
        start, stop = e.rows or (0, 0)
        if start != at or stop <= start:
            return False
        at = stop
    return at == first.shape[0]


def _tensor_body(t: TensorEntry) -> dict[str, Any]:
    body = {**dataclasses.asdict(t), "shape": list(t.shape)}
    if t.rows is None:
        del body["rows"]  # whole tensors keep the manifest's original form
    else:
        body["rows"] = list(t.rows)
    return body


def _canonical(body: dict[str, Any]) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def plan_buckets(sizes: Sequence[int], bucket_bytes: int) -> list[tuple[int, int]]:
    """(bucket index, offset) for tensors of ``sizes`` packed in order, each ALIGN-aligned.

    A tensor never straddles buckets; one larger than ``bucket_bytes`` gets a bucket of its own
    (checkpoint-engine sizes buckets as max(bucket size, largest tensor) for the same reason).
    """
    if bucket_bytes < ALIGN:
        raise errors.SpecError(f"must be at least {ALIGN}", field="bucket_bytes", value=bucket_bytes)
    out: list[tuple[int, int]] = []
    bucket, used = 0, 0
    for size in sizes:
        start = aligned(used)
        if used > 0 and start + size > bucket_bytes:
            bucket, start = bucket + 1, 0
        out.append((bucket, start))
        used = start + size
    return out
