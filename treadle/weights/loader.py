"""Inference-side weight updates: prefetch while serving, validate everything, then load or refuse.

Used by the vLLM worker extension (``treadle.weights.vllm_extension``), which hands ``apply`` the
engine's in-place reload; kept free of vLLM so the rules are unit-tested on their own:

- ``prefetch(v)`` pulls version ``v`` on a background thread while generation goes on;
- ``apply(v, load)`` takes that prefetched snapshot (or pulls now), which ``Reader.pull`` has
  already checked byte for byte against the manifest, then checks every tensor against the
  checkpoint the engine serves (names complete, shapes equal). Only then is ``load`` called.
  Anything failing before ``load`` leaves the served version untouched and raises;
- ``load`` itself failing leaves the model half-updated, which must never serve: the loader marks
  itself unhealthy and calls ``on_fatal`` (in vLLM: exit the worker, so the engine dies and the
  pod is restarted; vLLM's own in-place reload is not transactional).

The host buffer a version is pulled into is reused for the next one (pulled again only if a later
version needs more bytes), so its allocation, page-locked (``pull.pinned``) when the reader's
``allocate`` is for a CUDA engine, is paid once. ``load`` must therefore have finished reading the
tensors it was given when it returns (a ``non_blocking`` copy from pinned memory synchronized).

The caller (the inference agent) suspends generation around ``apply``; this module does not know
the engine's scheduler, only its weights.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import os
import struct
import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, NoReturn

from treadle import errors
from treadle.api import env_vars
from treadle.weights import layout, mooncake_client, objects, pull, tensors

log = logging.getLogger(__name__)

# safetensors header dtype -> our dtype names.
_SAFETENSORS_DTYPES = {
    "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2", "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8",
    "U16": "uint16", "U32": "uint32", "U64": "uint64", "BOOL": "bool",
}  # fmt: skip

Spec = Mapping[str, tuple[str, tuple[int, ...]]]
"""Tensor name -> (dtype, shape) of the checkpoint an engine serves."""


def model_dir(model: str, revision: str | None = None) -> Path:
    """The local folder of the checkpoint vLLM serves as ``model``: a path, or a hub id it downloaded.

    A hub id (``Qwen/Qwen3-8B``) is looked up in the Hugging Face cache only: vLLM downloaded the
    snapshot at startup, and a weight update must validate against exactly those files, not fetch.
    """
    if Path(model).is_dir():
        return Path(model)
    # vLLM's own dependency; only an engine reads hub checkpoints.
    import huggingface_hub
    from huggingface_hub import errors as hub_errors

    try:
        return Path(huggingface_hub.snapshot_download(model, revision=revision, local_files_only=True))
    except (hub_errors.LocalEntryNotFoundError, hub_errors.HFValidationError) as exc:
        raise errors.NotFound(
            f"model {model!r} (revision {revision or 'main'}) is neither a folder nor in the Hugging Face "
            f"cache: {exc}"
        ) from exc


def checkpoint_spec(model_dir: str | os.PathLike[str]) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Names, dtypes and shapes of every tensor in ``model_dir``'s ``*.safetensors`` (headers only)."""
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise errors.NotFound(f"{model_dir}: no *.safetensors files to validate published versions against")
    spec: dict[str, tuple[str, tuple[int, ...]]] = {}
    for path in files:
        with open(path, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(length))
        for name, entry in header.items():
            if name != "__metadata__":
                dtype = _SAFETENSORS_DTYPES.get(entry["dtype"], entry["dtype"])
                spec[name] = (dtype, tuple(int(d) for d in entry["shape"]))
    return spec


def check_copy(spec: Spec, copy: Spec, where: str) -> None:
    """``Conflict`` unless ``copy`` holds every tensor of ``spec`` with the same shape."""
    missing = sorted(set(spec) - set(copy))
    if missing:
        raise errors.Conflict(f"{where} lacks {len(missing)} checkpoint tensor(s), e.g. {missing[:3]}")
    wrong = [n for n, (_, shape) in spec.items() if copy[n][1] != shape]
    if wrong:
        n = wrong[0]
        raise errors.Conflict(
            f"{where}: {n} has shape {list(copy[n][1])}, the engine serves {list(spec[n][1])}"
        )


def store_from_env(env: Mapping[str, str], *, replicas: int | None = None) -> tuple[objects.ObjectStore, str]:
    """The store and prefix an engine reads from (and the job's trainer writes to, through
    ``treadle.client.connect``): TREADLE_WEIGHTS_PREFIX (the job's; with TREADLE_WEIGHTS_AGENT, a
    multi-agent job, that agent's ``layout.agent_prefix``) plus either TREADLE_WEIGHTS_DIR (local
    FileStore) or TREADLE_WEIGHTS_MASTER and TREADLE_WEIGHTS_METADATA (Mooncake). ``replicas``, the
    copies a writer makes (the job's ``spec.weights.replicas``), only matters to writers; unset:
    TREADLE_WEIGHTS_REPLICAS, default 2."""
    prefix = env.get(env_vars.WEIGHTS_PREFIX)
    if not prefix:
        raise errors.SpecError("is required", field=env_vars.WEIGHTS_PREFIX)
    agent = env.get(env_vars.WEIGHTS_AGENT)
    if agent:
        prefix = layout.agent_prefix(prefix, agent)
    if env.get(env_vars.WEIGHTS_DIR):
        return objects.FileStore(env[env_vars.WEIGHTS_DIR]), prefix
    master, metadata = env.get(env_vars.WEIGHTS_MASTER), env.get(env_vars.WEIGHTS_METADATA)
    if not master or not metadata:
        raise errors.SpecError(
            "set TREADLE_WEIGHTS_DIR, or TREADLE_WEIGHTS_MASTER and TREADLE_WEIGHTS_METADATA",
            field=env_vars.WEIGHTS_MASTER,
        )
    copies = int(env.get(env_vars.WEIGHTS_REPLICAS, "2")) if replicas is None else replicas
    return mooncake_client.MooncakeStore(
        mooncake_client.MooncakeConfig(master, metadata, replicas=copies)
    ), prefix


def _storage(snapshot: pull.Snapshot) -> objects.Bytes:
    """All of the buffer ``snapshot`` was pulled into, to reuse for the next version."""
    return snapshot.storage if snapshot.storage is not None else snapshot.buffer


def _exit_process(exc: BaseException) -> NoReturn:
    log.critical("weight load failed after the model was modified; exiting so the replica restarts: %r", exc)
    os._exit(70)


class Loader:
    """Prefetch, validate and apply versions for one engine; thread-safe."""

    def __init__(
        self,
        reader: pull.Reader,
        spec: Spec,
        *,
        loaded_version: int = 0,
        kind: tensors.Kind = "torch",
        on_fatal: Callable[[BaseException], NoReturn] = _exit_process,  # tests pass a recorder
        checkpoint: Callable[[], Iterable[tuple[str, Any]]] | None = None,
    ) -> None:
        self.reader = reader
        """Reads the versions of the agent whose weights the engine serves (its prefix)."""
        self._checkpoint = checkpoint
        """The tensors the engine started from: version 0 of every agent's prefix (moves only)."""
        self.spec = dict(spec)
        self.loaded_version = loaded_version
        """Version the engine serves; 0 is the checkpoint it started from."""
        self.kind = kind
        self.healthy = True
        self.last_error: str | None = None
        self._on_fatal = on_fatal
        self._lock = threading.Lock()
        self._pending: dict[int, concurrent.futures.Future[pull.Snapshot]] = {}
        self._spare: objects.Bytes | None = None  # buffer of the last applied version, reused

    def status(self) -> dict[str, Any]:
        with self._lock:
            return {
                "prefix": self.reader.prefix,
                "loaded_version": self.loaded_version,
                "healthy": self.healthy,
                "prefetching": sorted(v for v, f in self._pending.items() if not f.done()),
                "prefetched": sorted(
                    v for v, f in self._pending.items() if f.done() and f.exception() is None
                ),
                "last_error": self.last_error,
            }

    def prefetch(self, version: int) -> None:
        """Start pulling ``version`` in the background (no-op if it is already on its way)."""
        layout.check_version(version)
        with self._lock:
            if version <= self.loaded_version:
                raise errors.Conflict(
                    f"version {version} is not newer than the loaded version {self.loaded_version}"
                )
            if version not in self._pending:
                # Older prefetches are superseded: only the newest version will be applied.
                for old in [v for v in self._pending if v < version]:
                    self._pending.pop(old).cancel()
                spare, self._spare = self._spare, None
                self._pending[version] = self.reader.prefetch(version, kind=self.kind, spare=spare)

    def apply(
        self, version: int, load: Callable[[Iterable[tuple[str, Any]]], None], *, prefix: str | None = None
    ) -> dict[str, Any]:
        """Validate ``version`` completely, then ``load`` it; returns the new status.

        ``prefix`` other than the reader's: another agent's versions (an inter-agent move). Any
        version of it may be applied, older than the loaded one included (agents number their
        versions on their own); its version 0 is the checkpoint the engine started from, loaded
        again unless the engine still serves it. From then on the engine follows that prefix.

        Raises (NotFound, CorruptVersion, Conflict, Unavailable) with the served version untouched;
        if ``load`` raises, the model may be half-written: unhealthy, then ``on_fatal``.
        """
        layout.check_version(version)
        with self._lock:
            if not self.healthy:
                raise errors.Unavailable("this replica failed a weight load and must be restarted")
            moving = prefix is not None and prefix != self.reader.prefix
            if not moving and version <= self.loaded_version:
                raise errors.Conflict(
                    f"version {version} is not newer than the loaded version {self.loaded_version}"
                )
            reader = (
                pull.Reader(self.reader.store, prefix, allocate=self.reader.allocate)
                if moving and prefix is not None
                else self.reader
            )
            snapshot: pull.Snapshot | None = None
            weights: Iterable[tuple[str, Any]] | None = None
            try:
                if moving and version == 0:
                    weights = None if self.loaded_version == 0 else self._checkpoint_weights()
                else:
                    future = None if moving else self._pending.pop(version, None)
                    if future is not None:
                        snapshot = future.result()
                    else:
                        spare, self._spare = self._spare, None
                        try:
                            snapshot = reader.pull(version, kind=self.kind, spare=spare)
                        except BaseException:
                            self._spare = spare  # nothing of it was handed out
                            raise
                    weights = self._checked(snapshot)
            except (errors.TreadleError, concurrent.futures.CancelledError) as exc:
                if snapshot is not None and self._spare is None:
                    self._spare = _storage(snapshot)  # refused: none of its tensors was handed out
                self.last_error = f"{reader.prefix} v{version} refused: {exc}"
                if reader is not self.reader:
                    reader.close()
                raise
            if weights is not None:
                try:
                    load(weights)
                except BaseException as exc:
                    self.healthy = False
                    self.last_error = f"v{version} load failed: {exc!r}"
                    self._on_fatal(exc)
            self.loaded_version = version
            self.last_error = None
            if snapshot is not None:
                self._spare = _storage(snapshot)
            # Prefetches of the previous prefix, or older than this version, will never be applied.
            for old in [v for v in self._pending if moving or v <= version]:
                self._pending.pop(old).cancel()
            if reader is not self.reader:
                self.reader, previous = reader, self.reader
                previous.close()
        return self.status()

    def _checkpoint_weights(self) -> Iterable[tuple[str, Any]]:
        if self._checkpoint is None:
            raise errors.Conflict("version 0 is the engine's checkpoint, which this loader cannot read")
        return self._checkpoint()

    def _checked(self, snapshot: pull.Snapshot) -> list[tuple[str, Any]]:
        """The snapshot's tensors the checkpoint has, in its order; Conflict on any mismatch."""
        published = {t.name: (t.dtype, t.shape) for t in snapshot.manifest.tensors}
        check_copy(self.spec, published, f"v{snapshot.version}")
        # Names the checkpoint lacks (e.g. a tied lm_head.weight) are not loaded.
        return [(name, snapshot.tensors[name]) for name in self.spec]

    def close(self) -> None:
        self.reader.close()
