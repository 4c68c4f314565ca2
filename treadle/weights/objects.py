"""The object store interface weight publication runs on, and its local (file) implementation.

``Publisher`` and ``Reader`` talk only to an ``ObjectStore``: ``mooncake_client.MooncakeStore`` in a
cluster, ``FileStore`` (a directory, ``/dev/shm`` by default) in local mode and in fast tests. Errors
follow one contract so callers need not know the backend: a missing key is ``None`` / ``NotFound``;
an object of the wrong size is ``CorruptVersion``; anything transient (a store process down, a
transfer failed) is ``Unavailable`` and worth retrying until a deadline, which ``retrying`` does.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar

import numpy as np

from treadle import errors
from treadle.weights import layout

Bytes = np.ndarray[Any, np.dtype[np.uint8]]
T = TypeVar("T")


class ObjectStore(Protocol):
    """Bytes by key. Single writer per key prefix; readers may be many and in other processes."""

    def put(self, key: str, data: Bytes | bytes) -> None:
        """Create or replace ``key``; returns once every replica holds the bytes."""

    def create(self, key: str, data: bytes) -> bool:
        """Write ``key`` only if absent; False (and nothing written) if it exists."""

    def get(self, key: str) -> bytes | None:
        """A small object whole; None if missing."""

    def get_into(self, key: str, out: Bytes) -> None:
        """Fill ``out`` with ``key``; NotFound if missing, CorruptVersion if its size differs."""

    def exists(self, key: str) -> bool: ...

    def remove(self, key: str) -> bool:
        """Delete ``key``; True if it is gone afterwards (also when it never existed)."""

    def remove_dir(self, prefix: str) -> None:
        """Delete every key under ``prefix + '/'``, best effort; check with ``exists``."""

    def register(self, buf: Bytes) -> None:
        """Announce a buffer that will be passed to put/get_into (zero-copy backends pin it)."""

    def unregister(self, buf: Bytes) -> None: ...

    def close(self) -> None: ...


def retrying(
    what: str,
    call: Callable[[], T],
    *,
    deadline_s: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """``call()`` again on Unavailable (backoff 50 ms doubling to 1 s) until ``deadline_s`` passes.

    A Mooncake store process that died keeps its objects listed until the master's client TTL
    (10 s by default) expires; reads that land on it fail meanwhile, then go to a live replica.
    The deadline must therefore exceed that TTL.
    """
    start, delay = clock(), 0.05
    while True:
        try:
            return call()
        except errors.Unavailable as exc:
            if clock() - start + delay > deadline_s:
                raise errors.Unavailable(f"{what}: still failing after {deadline_s:.0f}s: {exc}") from exc
            sleep(delay)
            delay = min(1.0, delay * 2)


class FileStore:
    """An ObjectStore in a directory: one file per key, replaced atomically by rename.

    For local mode (one machine, trainer and inference sharing ``/dev/shm``) and fast tests. There
    is one copy of each object; durability is the directory's.
    """

    def __init__(self, root: str | os.PathLike[str] | None = None) -> None:
        default = (
            "/dev/shm/treadle-weights"
            if Path("/dev/shm").is_dir()
            else Path(tempfile.gettempdir()) / "treadle-weights"
        )
        self.root = Path(root if root is not None else default)
        self.root.mkdir(parents=True, exist_ok=True)

    def _path(self, key: str) -> Path:
        if key.startswith("/") or ".." in key.split("/"):
            raise errors.SpecError("must be a relative key without '..'", field="key", value=key)
        return self.root / key

    def put(self, key: str, data: Bytes | bytes) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data if isinstance(data, bytes) else data.data)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def create(self, key: str, data: bytes) -> bool:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            # link() fails if the target exists: an atomic create-if-absent on POSIX filesystems.
            os.link(tmp, path)
            return True
        except FileExistsError:
            return False
        finally:
            Path(tmp).unlink(missing_ok=True)

    def get(self, key: str) -> bytes | None:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            return None

    def get_into(self, key: str, out: Bytes) -> None:
        try:
            with open(self._path(key), "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size != out.nbytes:
                    raise layout.CorruptVersion(f"{key}: {size} bytes stored, manifest says {out.nbytes}")
                got = f.readinto(out.data)
        except FileNotFoundError as exc:
            raise errors.NotFound(f"{key}: not in the store") from exc
        if got != out.nbytes:
            raise errors.Unavailable(f"{key}: short read ({got} of {out.nbytes} bytes)")

    def exists(self, key: str) -> bool:
        return self._path(key).exists()

    def remove(self, key: str) -> bool:
        self._path(key).unlink(missing_ok=True)
        return True

    def remove_dir(self, prefix: str) -> None:
        shutil.rmtree(self._path(prefix), ignore_errors=True)

    def register(self, buf: Bytes) -> None:
        """Nothing to pin: files are read with plain syscalls."""

    def unregister(self, buf: Bytes) -> None:
        """Nothing was pinned."""

    def close(self) -> None:
        """No connection to close."""
