"""The reference trainer's optimizer state, kept beside every version it publishes, in shards.

A restarted trainer (``treadle.trainer.job``) goes on from the job's committed version: its weights
come from the weight store, and so, from here, do Adam's moments and step counts of that version,
so the first update after a restart is the one an uninterrupted trainer would have made (without
them Adam starts again from zero and its first updates are bias-corrected as a first step's).

The state is published as its own versions, numbered as the weights' and under
``<weights prefix>/optimizer_state`` (``prefix``): no agent can be named so (agent names are DNS
labels, with no ``_``), so neither an engine nor a multi-agent job's agent prefix ever meets it.
It goes through the same ``weights.publish.Publisher`` (checksummed buckets, the manifest as the
commit point, versions beyond the staleness window deleted), each rank writing its own rows of
Adam's moments (``treadle.trainer.sharded``), and ``weights.pull.Reader``; it is
written right after the weights of its version, before that version is committed, so every
committed version has its state unless the store lost it (then the trainer says so and starts
Adam from zero).
"""

from __future__ import annotations

from typing import Any

import torch

from treadle import errors
from treadle.trainer import parallel, sharded
from treadle.weights import layout, objects, publish, pull

SEGMENT = "optimizer_state"


def prefix(weights_prefix: str) -> str:
    """Where the optimizer state of the versions under ``weights_prefix`` lives."""
    return layout.check_prefix(f"{weights_prefix}/{SEGMENT}")


class OptimizerStore:
    """Publishes and pulls the optimizer state of the versions under one weights prefix."""

    def __init__(self, store: objects.ObjectStore, weights_prefix: str, *, keep_versions: int) -> None:
        self.store = store
        self.prefix = prefix(weights_prefix)
        self.publisher = publish.Publisher(store, self.prefix, staleness_window=keep_versions - 1)

    def save(self, version: int, model: Any, optimizer: torch.optim.Optimizer, world: parallel.World) -> None:
        """Every rank publishes its shards of ``optimizer``'s state as ``version`` (a collective)."""
        sharded.publish_parts(self.publisher, sharded.optimizer_state(model, optimizer), version, world)

    def load(self, version: int, model: Any, optimizer: torch.optim.Optimizer) -> bool:
        """Restore ``version``'s state into ``optimizer`` (a collective); False when the store does not
        hold it (every rank reads the same store, so every rank answers alike)."""
        reader = pull.Reader(self.store, self.prefix)
        try:
            snapshot = reader.pull(version, kind="torch")
        except errors.NotFound:
            return False
        finally:
            reader.close()
        sharded.load_optimizer(model, optimizer, snapshot.tensors)
        return True
