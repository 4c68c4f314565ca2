"""The trainer's ranks as one learner: rank 0 leads, the others follow its commands in lockstep.

Called by ``treadle.trainer.job`` (every rank) and ``treadle train`` (one rank). Only rank 0 talks
to the job's services (batches, fences, commits: ``treadle.trainer.loop``); for each batch it
broadcasts a ``Command`` (the batch and the version to publish it as), and then every rank runs the
same sequence of collectives:

1. the GRPO step on its share of the batch (``treadle.trainer.step``);
2. its part of the weights, then of Adam's state, into the store; rank 0 commits each
   (``treadle.trainer.sharded``).

A rank that fails raises out of a collective on the others too, so the group fails as one; its pod
(or ``torchrun``) restarts it, and the restarted group resumes from the job's committed version
(``resume``).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from treadle.client import batches as batches_mod
from treadle.trainer import checkpoint, loop, parallel, policy, sharded
from treadle.trainer import step as step_mod
from treadle.weights import layout, publish, pull

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Command:
    batch: batches_mod.TrainBatch | None
    """None: training is over, the followers return."""
    version: int = 0
    """The version the step's weights are published as."""


class Group:
    def __init__(
        self,
        world: parallel.World,
        pol: policy.Policy,
        *,
        lr: float,
        settings: step_mod.Settings,
        weights: publish.Publisher,
        optimizer_store: checkpoint.OptimizerStore | None = None,
    ) -> None:
        """``pol.model`` must be sharded already (``parallel.shard``)."""
        self.world = world
        self.policy = pol
        self.settings = settings
        self.weights = weights
        self.optimizer = torch.optim.Adam(pol.model.parameters(), lr=lr)
        self.optimizer_store = optimizer_store
        """Where each version's optimizer state goes too (None: nowhere)."""

    def step(self, batch: batches_mod.TrainBatch, version: int) -> loop.Stepped:
        """Rank 0: train every rank on ``batch`` and publish the result as ``version`` (blocking)."""
        began = time.perf_counter()
        command = parallel.broadcast(Command(batch, version), self.world)
        stats, manifest, trained = self._run(command)
        assert manifest is not None  # rank 0 commits, so it has the manifest
        return loop.Stepped(stats, manifest, trained - began, time.perf_counter() - trained)

    def stop(self) -> None:
        """Rank 0: release the followers."""
        parallel.broadcast(Command(None), self.world)

    def follow(self) -> int:
        """Every other rank: run rank 0's commands until it stops; returns the steps run."""
        steps = 0
        while (command := parallel.broadcast(None, self.world)).batch is not None:
            self._run(command)
            steps += 1
        return steps

    def _run(self, command: Command) -> tuple[step_mod.StepStats, layout.Manifest | None, float]:
        """The step, the published manifest (rank 0) and when training ended."""
        assert command.batch is not None
        stats = step_mod.train_step(self.policy, self.optimizer, command.batch, self.settings, self.world)
        trained = time.perf_counter()
        manifest = sharded.publish_parts(
            self.weights, self.policy.model.state_dict(), command.version, self.world
        )
        if self.optimizer_store is not None:  # before the version can be committed (at the next fence)
            self.optimizer_store.save(command.version, self.policy.model, self.optimizer, self.world)
        return stats, manifest, trained

    def resume(self, version: int) -> bool:
        """Load the committed ``version``'s weights and (if stored) Adam's state on every rank (a
        collective); True when the optimizer state came back too. NotFound, naming the version, when
        the store no longer holds the weights: the learned policy is lost, which is said, not hidden by
        training on from the base checkpoint."""
        reader = pull.Reader(self.weights.store, self.weights.prefix)
        try:
            snapshot = reader.pull(version, kind="torch")
        finally:
            reader.close()
        sharded.load_model(self.policy.model, snapshot.tensors)
        if self.optimizer_store is None:
            return False
        return self.optimizer_store.load(version, self.policy.model, self.optimizer)

    def state_dict(self) -> dict[str, Any]:
        """The model's full weights on every rank (a collective; for tests and small models)."""
        return get_model_state_dict(self.policy.model, options=StateDictOptions(full_state_dict=True))
