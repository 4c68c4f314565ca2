"""vLLM worker extension: pull published weight versions and swap them in, never partially.

Start vLLM with ``VLLM_SERVER_DEV_MODE=1``, the store settings ``loader.store_from_env`` reads, and
``--worker-extension-cls treadle.weights.vllm_extension.WeightsExtension --weight-transfer-config
'{"backend":"treadle"}'`` (``treadle.api.base.VLLM_WEIGHTS_ARGS``). Importing this module in a vLLM
process registers that weight-transfer engine (``treadle.weights.transfer_engine``), which vLLM's own
update routes drive; the extension adds what those routes lack. The inference agent (or a test)
drives an update over vLLM's dev routes::

    POST /collective_rpc {"method": "treadle_weights_prefetch", "args": ["7"]}   # while generating
    POST /pause?mode=keep                                                        # suspend
    POST /start_weight_update
    POST /update_weights {"update_info": {"version": 7}}                         # validate + load
    POST /finish_weight_update
    POST /reset_prefix_cache                                                     # old-weight KV
    POST /resume
    POST /collective_rpc {"method": "treadle_weights_status"}                    # loaded_version

``{"method": "treadle_weights_apply", "args": ["7"]}`` loads the same way through ``collective_rpc``
(the same ``receive.Receiver``), for an engine started without the weight-transfer config.

A reward-model engine of the reward gateway (``treadle.services.reward.engines.VllmEngines``) is not
versioned: its restore reloads the checkpoint from the gateway's host-memory copy of it,
``{"method": "treadle_weights_restore", "args": ["/dev/shm/treadle-reward-models/judge"]}``.

In a multi-agent job each agent's versions live under ``<TREADLE_WEIGHTS_PREFIX>/<agent>``
(``layout.agent_prefix``); the engine starts on ``TREADLE_WEIGHTS_AGENT``'s. An inter-agent move
(placement's rebalancer) applies the receiver's version with the agent named,
``{"update_info": {"version": 3, "agent": "planner"}}``, and the engine follows that
agent's versions from then on; version 0 of an agent is the checkpoint the engine started from.

vLLM passes collective_rpc arguments as strings, hence ``version: str``. An apply that is refused
(missing, corrupt or mismatched version) raises, so the route answers 500 and the engine keeps
serving the previous version; a load that fails midway exits the worker (see ``loader``).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

from treadle.weights import loader, receive


class WeightsExtension:
    """Mixed into vLLM's worker class; ``model_runner`` and ``vllm_config`` are the worker's."""

    model_runner: Any
    vllm_config: Any

    def _treadle_receiver(self) -> receive.Receiver:
        """The weight-transfer engine's receiver when vLLM built ours, else the extension's own."""
        engine = getattr(self, "weight_transfer_engine", None)
        if engine is not None and hasattr(engine, "treadle_receiver"):
            shared: receive.Receiver = engine.treadle_receiver()
            return shared
        existing: receive.Receiver | None = getattr(self, "_treadle_weights_receiver", None)
        if existing is None:
            config = self.vllm_config.model_config
            existing = receive.Receiver(config.model, config.revision)
            self._treadle_weights_receiver = existing
        return existing

    def _treadle_loader(self) -> loader.Loader:
        return self._treadle_receiver().loader

    def treadle_weights_status(self) -> dict[str, Any]:
        return self._treadle_loader().status()

    def treadle_weights_prefetch(self, version: str) -> dict[str, Any]:
        target = self._treadle_loader()
        target.prefetch(int(version))
        return target.status()

    def treadle_weights_apply(self, version: str, agent: str = "") -> dict[str, Any]:
        """Load ``version`` of the agent served now, or with ``agent``, of that agent (a move)."""

        def reload(weights: Iterator[tuple[str, Any]]) -> None:
            self.model_runner.reload_weights(weights_iterator=weights)

        return self._treadle_receiver().apply(version, agent, reload, self.model_runner.get_model())

    def treadle_weights_restore(self, path: str) -> dict[str, Any]:
        """Reload the engine's own checkpoint from its copy in ``path`` (a reward model's backup).

        The copy's tensors are checked against the checkpoint the engine started from (every name,
        equal shapes) before any is loaded: a mismatch raises with the weights untouched.
        """
        config = self.vllm_config.model_config
        model_dir = loader.model_dir(config.model, config.revision)
        loader.check_copy(loader.checkpoint_spec(model_dir), loader.checkpoint_spec(path), path)

        def reload(weights: Iterator[tuple[str, Any]]) -> None:
            self.model_runner.reload_weights(weights_iterator=weights)

        receive.load(reload, self.model_runner.get_model(), receive.safetensors_dir(path))
        return {"restored": path}


def _register_engine() -> None:
    """In a vLLM process (the worker imports this class before it builds its weight-transfer engine):
    register Treadle's engine. Elsewhere vLLM is not imported for it (it takes seconds)."""
    if "vllm" in sys.modules:
        from treadle.weights import transfer_engine

        transfer_engine.register()


_register_engine()
