"""The reference trainer's optimizer state, kept beside every version it publishes.

A restarted trainer (``treadle.trainer.job``) goes on from the job's committed version: its weights
come from the weight store, and so, from here, do Adam's moments and step counts of that version,
so the first update after a restart is the one an uninterrupted trainer would have made (without
them Adam starts again from zero and its first updates are bias-corrected as a first step's).

The state is published as its own versions, numbered as the weights' and under
``<weights prefix>/optimizer_state`` (``prefix``): no agent can be named so (agent names are DNS
labels, with no ``_``), so neither an engine nor a multi-agent job's agent prefix ever meets it.
It goes through the same ``weights.publish.Publisher`` (checksummed buckets, the manifest as the
commit point, versions beyond the staleness window deleted) and ``weights.pull.Reader``; it is
written right after the weights of its version, before that version is committed, so every
committed version has its state unless the store lost it (then the trainer says so and starts
Adam from zero).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import torch

from treadle import errors
from treadle.weights import layout, objects, publish, pull

SEGMENT = "optimizer_state"


def prefix(weights_prefix: str) -> str:
    """Where the optimizer state of the versions under ``weights_prefix`` lives."""
    return layout.check_prefix(f"{weights_prefix}/{SEGMENT}")


def state_tensors(optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """Every per-parameter state tensor (Adam: ``step``, ``exp_avg``, ``exp_avg_sq``), named
    ``<parameter index>.<key>``; the hyperparameters are the job's, not saved."""
    out: dict[str, torch.Tensor] = {}
    for index, state in optimizer.state_dict()["state"].items():
        for key, value in state.items():
            out[f"{index}.{key}"] = value if isinstance(value, torch.Tensor) else torch.tensor(value)
    return out


def restore(optimizer: torch.optim.Optimizer, saved: Mapping[str, torch.Tensor]) -> None:
    """Load ``state_tensors``' output into ``optimizer`` (over the same parameters), copied."""
    state: dict[int, dict[str, torch.Tensor]] = {}
    for name, value in saved.items():
        index, sep, key = name.partition(".")
        if not sep or not index.isdigit():
            raise errors.SpecError("expected '<parameter index>.<key>'", field="optimizer state", value=name)
        state.setdefault(int(index), {})[key] = value.clone()
    optimizer.load_state_dict({"state": state, "param_groups": optimizer.state_dict()["param_groups"]})


class OptimizerStore:
    """Publishes and pulls the optimizer state of the versions under one weights prefix."""

    def __init__(self, store: objects.ObjectStore, weights_prefix: str, *, keep_versions: int) -> None:
        self.store = store
        self.prefix = prefix(weights_prefix)
        self._publisher = publish.Publisher(store, self.prefix, staleness_window=keep_versions - 1)

    async def save(self, version: int, optimizer: torch.optim.Optimizer) -> None:
        """Publish ``optimizer``'s state as ``version`` (read in place: step it only after this)."""
        await asyncio.to_thread(self._publisher.publish, state_tensors(optimizer), version)

    def load(self, version: int, optimizer: torch.optim.Optimizer) -> bool:
        """Restore ``version``'s state into ``optimizer``; False when the store does not hold it."""
        reader = pull.Reader(self.store, self.prefix)
        try:
            snapshot = reader.pull(version, kind="torch")
        except errors.NotFound:
            return False
        finally:
            reader.close()
        restore(optimizer, snapshot.tensors)
        return True
