"""A vLLM worker's side of a weight update: pull a published version, verify it, load it, or refuse.

One code path for both ways in: vLLM's own weight-update routes, through the registered weight-transfer
engine (``treadle.weights.transfer_engine``), and the worker extension's ``collective_rpc`` methods
(``treadle.weights.vllm_extension``). A worker has one ``Receiver``: the engine's when vLLM was started
with ``--weight-transfer-config '{"backend":"treadle"}'`` (the extension then uses it too, so a
prefetch through the extension is what the engine applies), else the extension's own.

Importing this module does not import vLLM or torch (unit tests build a ``Receiver`` without them).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from treadle import errors
from treadle.api import env_vars
from treadle.weights import layout, loader, pull

Reload = Callable[[Iterator[tuple[str, Any]]], None]
"""Loads (name, tensor) pairs into the model in place: vLLM's in-place ``reload_weights``."""


class Refused(errors.TreadleError):
    """A version the worker would not load (missing, corrupt, mismatched); it keeps serving the old one.

    The message names the prefix and version, and what failed (for a damaged bucket, its key)."""


def cuda() -> bool:
    """Whether this worker's torch has CUDA (vLLM's own dependency; CPU builds have none)."""
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


class Receiver:
    """The loader of one engine worker (store and prefix from its environment) and how it loads."""

    def __init__(self, model: str, revision: str | None, environ: Mapping[str, str] = os.environ) -> None:
        store, prefix = loader.store_from_env(environ)
        self.environ = environ
        self.model_dir = loader.model_dir(model, revision)
        initial = int(environ.get(env_vars.WEIGHTS_INITIAL_VERSION, "0"))
        # A CUDA engine copies the pulled tensors host-to-device while paused: from page-locked
        # memory apply took 0.041 s instead of 0.247 s at 2 GB on an H200
        # (bench/reports/weights-gpu.md). CPU builds: pageable.
        allocate = pull.pinned if cuda() else pull.pageable
        self.loader = loader.Loader(
            pull.Reader(store, prefix, allocate=allocate), loader.checkpoint_spec(self.model_dir),
            loaded_version=initial, kind="torch", checkpoint=self.checkpoint,
        )  # fmt: skip

    def checkpoint(self) -> Iterator[tuple[str, Any]]:
        """The checkpoint's tensors, one file at a time (version 0, for a move to an untrained agent)."""
        return safetensors_dir(self.model_dir)

    def apply(self, version: int | str, agent: str, reload: Reload, model: Any) -> dict[str, Any]:
        """Load ``version`` of the agent served now or, with ``agent``, of that agent (a move).

        ``reload`` loads into ``model``. ``Refused`` before anything is loaded; a load that fails
        midway exits the worker (``loader.Loader.apply``). Returns the loader's status.
        """
        prefix = layout.agent_prefix(self.environ[env_vars.WEIGHTS_PREFIX], agent) if agent else None
        where = prefix or self.loader.reader.prefix
        try:
            number = int(version)
        except (TypeError, ValueError):
            raise Refused(f"{where}: version {version!r} is not an integer") from None
        try:
            return self.loader.apply(number, lambda weights: load(reload, model, weights), prefix=prefix)
        except errors.TreadleError as exc:
            raise Refused(f"{where} v{number} refused: {exc}") from exc


def load(reload: Reload, model: Any, weights: Iterable[tuple[str, Any]]) -> None:
    """``reload`` the weights into ``model``, then what vLLM's reload leaves undone on this build."""
    reload(iter(weights))
    repack_vocab_embeddings(model)
    if cuda():
        # The pinned buffer is refilled by the next prefetch: no copy from it may be in flight.
        import torch

        torch.cuda.synchronize()


def safetensors_dir(path: str | os.PathLike[str]) -> Iterator[tuple[str, Any]]:
    """Every tensor of ``path``'s ``*.safetensors``, one file at a time, as torch tensors."""
    from safetensors import torch as st_torch

    for file in sorted(Path(path).glob("*.safetensors")):
        yield from st_torch.load_file(str(file)).items()


def repack_vocab_embeddings(model: Any) -> None:
    """Redo the CPU GEMM packing of every vocabulary embedding from its reloaded weights.

    On vLLM CPU 0.32 ``reload_weights`` updates the embedding table but not the packed copy that
    a tied LM head multiplies with (made once by ``process_weights_after_loading`` at start), so
    without this the new version's logits come out of the old head. Found by the reference
    trainer, whose logprobs now match vLLM's after every swap. Engines without ``cpu_linear``
    (GPU builds) have nothing to repack.
    """
    from vllm.model_executor.layers import vocab_parallel_embedding

    for module in model.modules():
        if isinstance(module, vocab_parallel_embedding.VocabParallelEmbedding) and hasattr(
            module, "cpu_linear"
        ):
            module.quant_method.process_weights_after_loading(module)
