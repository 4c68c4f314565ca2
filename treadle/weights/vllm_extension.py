"""vLLM worker extension: pull published weight versions and swap them in, never partially.

Start vLLM with ``--worker-extension-cls treadle.weights.vllm_extension.WeightsExtension`` and
``VLLM_SERVER_DEV_MODE=1``, plus the store settings ``loader.store_from_env`` reads. The inference
agent (or a test) then drives an update over vLLM's dev routes::

    POST /collective_rpc {"method": "treadle_weights_prefetch", "args": ["7"]}   # while generating
    POST /pause?mode=keep                                                        # suspend
    POST /collective_rpc {"method": "treadle_weights_apply", "args": ["7"]}      # validate + load
    POST /reset_prefix_cache                                                     # old-weight KV
    POST /resume
    POST /collective_rpc {"method": "treadle_weights_status"}                    # loaded_version

A reward-model engine of the reward gateway (``treadle.services.reward.engines.VllmEngines``) is not
versioned: its restore reloads the checkpoint from the gateway's host-memory copy of it,
``{"method": "treadle_weights_restore", "args": ["/dev/shm/treadle-reward-models/judge"]}``.

In a multi-agent job each agent's versions live under ``<TREADLE_WEIGHTS_PREFIX>/<agent>``
(``layout.agent_prefix``); the engine starts on ``TREADLE_WEIGHTS_AGENT``'s. An inter-agent move
(placement's rebalancer) applies the receiver's version with the agent as a second argument,
``{"method": "treadle_weights_apply", "args": ["3", "planner"]}``, and the engine follows that
agent's versions from then on; version 0 of an agent is the checkpoint the engine started from.

vLLM passes collective_rpc arguments as strings, hence ``version: str``. An apply that is refused
(missing, corrupt or mismatched version) raises, so the route answers 500 and the engine keeps
serving the previous version; a load that fails midway exits the worker (see ``loader``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from treadle.api import env_vars
from treadle.weights import layout, loader, pull


def _cuda() -> bool:
    """Whether this worker's torch has CUDA (vLLM's own dependency; CPU builds have none)."""
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


class WeightsExtension:
    """Mixed into vLLM's worker class; ``model_runner`` and ``vllm_config`` are the worker's."""

    model_runner: Any
    vllm_config: Any

    def _treadle_loader(self) -> loader.Loader:
        existing: loader.Loader | None = getattr(self, "_treadle_weights_loader", None)
        if existing is None:
            store, prefix = loader.store_from_env(os.environ)
            spec = loader.checkpoint_spec(self._treadle_model_dir())
            initial = int(os.environ.get(env_vars.WEIGHTS_INITIAL_VERSION, "0"))
            # A CUDA engine copies the pulled tensors host-to-device while paused: from page-locked
            # memory apply took 0.041 s instead of 0.247 s at 2 GB on an H200
            # (bench/reports/weights-gpu.md). CPU builds: pageable.
            allocate = pull.pinned if _cuda() else pull.pageable
            existing = loader.Loader(
                pull.Reader(store, prefix, allocate=allocate), spec, loaded_version=initial, kind="torch",
                checkpoint=self._treadle_checkpoint,
            )  # fmt: skip
            self._treadle_weights_loader = existing
        return existing

    def _treadle_model_dir(self) -> Path:
        config = self.vllm_config.model_config
        return loader.model_dir(config.model, config.revision)

    def _treadle_checkpoint(self) -> Iterator[tuple[str, Any]]:
        """The checkpoint's tensors, one file at a time (version 0, for a move to an untrained agent)."""
        from safetensors import torch as st_torch

        for path in sorted(self._treadle_model_dir().glob("*.safetensors")):
            yield from st_torch.load_file(str(path)).items()

    def treadle_weights_status(self) -> dict[str, Any]:
        return self._treadle_loader().status()

    def treadle_weights_prefetch(self, version: str) -> dict[str, Any]:
        target = self._treadle_loader()
        target.prefetch(int(version))
        return target.status()

    def treadle_weights_apply(self, version: str, agent: str = "") -> dict[str, Any]:
        """Load ``version`` of the agent served now, or with ``agent``, of that agent (a move)."""

        def load(weights: Iterable[tuple[str, Any]]) -> None:
            self.model_runner.reload_weights(weights_iterator=iter(weights))
            self._repack_vocab_embeddings()
            if _cuda():
                # The pinned buffer is refilled by the next prefetch: no copy from it may be in flight.
                import torch

                torch.cuda.synchronize()

        prefix = layout.agent_prefix(os.environ[env_vars.WEIGHTS_PREFIX], agent) if agent else None
        return self._treadle_loader().apply(int(version), load, prefix=prefix)

    def treadle_weights_restore(self, path: str) -> dict[str, Any]:
        """Reload the engine's own checkpoint from its copy in ``path`` (a reward model's backup).

        The copy's tensors are checked against the checkpoint the engine started from (every name,
        equal shapes) before any is loaded: a mismatch raises with the weights untouched.
        """
        from safetensors import torch as st_torch

        loader.check_copy(
            loader.checkpoint_spec(self._treadle_model_dir()), loader.checkpoint_spec(path), path
        )

        def weights() -> Iterator[tuple[str, Any]]:
            for file in sorted(Path(path).glob("*.safetensors")):
                yield from st_torch.load_file(str(file)).items()

        self.model_runner.reload_weights(weights_iterator=weights())
        self._repack_vocab_embeddings()
        if _cuda():
            import torch

            torch.cuda.synchronize()
        return {"restored": path}

    def _repack_vocab_embeddings(self) -> None:
        """Redo the CPU GEMM packing of every vocabulary embedding from its reloaded weights.

        On vLLM CPU 0.32 ``reload_weights`` updates the embedding table but not the packed copy that
        a tied LM head multiplies with (made once by ``process_weights_after_loading`` at start), so
        without this the new version's logits come out of the old head. Found by the reference
        trainer, whose logprobs now match vLLM's after every swap. Engines without ``cpu_linear``
        (GPU builds) have nothing to repack.
        """
        from vllm.model_executor.layers import vocab_parallel_embedding

        for module in self.model_runner.get_model().modules():
            if isinstance(module, vocab_parallel_embedding.VocabParallelEmbedding) and hasattr(
                module, "cpu_linear"
            ):
                module.quant_method.process_weights_after_loading(module)
