"""Treadle's weight store as a vLLM weight-transfer engine, backend ``"treadle"``.

Start vLLM with ``VLLM_SERVER_DEV_MODE=1``, the store settings ``loader.store_from_env`` reads and::

    --worker-extension-cls treadle.weights.vllm_extension.WeightsExtension
    --weight-transfer-config '{"backend":"treadle"}'

The worker imports the extension before it builds its weight-transfer engine, and importing the
extension in a vLLM process registers this engine (vLLM checks the backend name only then, in the
worker: the API server accepts any name). No ``init_weight_transfer_engine`` is needed: the store and
prefix are the pod's. A weight update then goes through vLLM's own routes::

    POST /start_weight_update
    POST /update_weights {"update_info": {"version": 7}}                   # pull, verify, load
    POST /update_weights {"update_info": {"version": 3, "agent": "planner"}}   # a move (multi-agent)
    POST /finish_weight_update

``update_weights`` pulls the version's buckets (or takes the extension's prefetch of it), checks every
bucket and the manifest, then reloads the model in place (``receive``). A missing, corrupt or
mismatched version is refused with an error naming the version (and the damaged bucket), the route
answers 500 and the engine keeps serving the previous version; vLLM ends the update session itself.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

import torch
from vllm.distributed.weight_transfer import base, factory
from vllm.model_executor.model_loader.reload import inplace

from treadle.api.base import VLLM_WEIGHT_TRANSFER_BACKEND
from treadle.weights import receive

BACKEND = VLLM_WEIGHT_TRANSFER_BACKEND


@dataclasses.dataclass
class InitInfo(base.WeightTransferInitInfo):
    """Nothing: the engine reads the store and prefix from its environment."""


@dataclasses.dataclass
class UpdateInfo(base.WeightTransferUpdateInfo):
    version: int | str
    """The committed version to load (vLLM passes JSON through; a numeric string is accepted)."""
    agent: str = ""
    """A multi-agent job's agent whose versions to load and follow from then on (a move); empty:
    the agent served now."""


class TreadleWeightTransferEngine(base.WeightTransferEngine[InitInfo, UpdateInfo]):
    """Loads committed versions from Treadle's store; the worker's ``receive.Receiver`` lives here."""

    init_info_cls = InitInfo
    update_info_cls = UpdateInfo
    supports_draft_weight_update = False

    def __init__(self, config: Any, vllm_config: Any, device: torch.device, model: torch.nn.Module) -> None:
        super().__init__(config, vllm_config, device, model)
        self._receiver: receive.Receiver | None = None

    def treadle_receiver(self) -> receive.Receiver:
        """Built on first use, so that an engine nobody updates needs no store settings."""
        if self._receiver is None:
            config = self.vllm_config.model_config
            self._receiver = receive.Receiver(config.model, config.revision)
        return self._receiver

    def init_transfer_engine(self, init_info: InitInfo) -> None:
        pass

    def start_weight_update(self) -> None:
        pass

    def finish_weight_update(self) -> None:
        pass

    def update_weights(self, update_info: dict[str, Any]) -> None:
        # Not the base class's: it calls torch.accelerator.synchronize(), which raises on a CPU build
        # of torch with CUDA compiled in; the load synchronizes CUDA itself.
        self.receive_weights(self.parse_update_info(update_info))

    def receive_weights(self, update_info: UpdateInfo) -> None:
        model, vllm_config = self.model, self.vllm_config

        def reload(weights: Iterator[tuple[str, Any]]) -> None:
            inplace.reload_weights(
                vllm_config, model, weights_iterator=weights, weights_path=None, is_checkpoint_format=True
            )

        self.treadle_receiver().apply(update_info.version, update_info.agent, reload, model)

    def shutdown(self) -> None:
        pass  # no connection to release: the store's are reused by the next update


def register() -> None:
    """Make ``BACKEND`` known to vLLM's factory in this process (again: no-op)."""
    with contextlib.suppress(ValueError):  # already registered
        factory.WeightTransferEngineFactory.register_engine(
            BACKEND, __name__, TreadleWeightTransferEngine.__name__
        )


register()
