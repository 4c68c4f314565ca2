"""The trainer's side of weight publication: publish a state dict as the next version, then commit.

Called by trainers (the reference GRPO trainer, user trainers) in their loop::

    published = await publisher.publish(model.state_dict())     # buckets, then manifest
    await publisher.commit(published.version, step=step, mean_reward=reward)  # tell the control plane

Publishing runs ``treadle.weights.publish.Publisher`` on a worker thread so the event loop (and
the next ``get_batch``) keeps going; the state dict must not be modified until ``publish``
returns, because tensors are read in place. Commit is refused for a version whose manifest is not
in the store, so the control plane never announces a version inference cannot pull. The committer
is anything with ``async commit_version(version)`` (the scheduler client, or None in local mode).

A multi-agent job's trainer publishes each agent's versions under that agent's prefix, one
``publish.Publisher(store, layout.agent_prefix(prefix, agent))`` per agent, where ``prefix`` is the
job's (``TREADLE_WEIGHTS_PREFIX`` as the operator renders it for the engines); an engine that
placement moves to another agent then loads that agent's versions (``treadle.weights.layout``).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from treadle import errors
from treadle.weights import layout, publish


class Committer(Protocol):
    async def commit_version(
        self, version: int, *, step: int = 0, mean_reward: float | None = None
    ) -> Any: ...


@dataclasses.dataclass(frozen=True)
class Committed:
    version: int
    aborted_trajectory_ids: tuple[str, ...]
    """In-flight trajectories the control plane aborted as too stale for this version."""


class Publisher:
    def __init__(self, weights: publish.Publisher, *, committer: Committer | None = None) -> None:
        self.weights = weights
        self.committer = committer
        self.committed: int = 0
        """Last version committed by this publisher; 0 is the version inference started with."""
        self._lock = asyncio.Lock()

    def next_version(self) -> int:
        latest = self.weights.latest
        return 1 if latest is None else latest + 1

    async def publish(self, state_dict: Mapping[str, Any], version: int | None = None) -> layout.Manifest:
        """Store ``state_dict`` as ``version`` (default: the next one) and return its manifest."""
        async with self._lock:
            target = self.next_version() if version is None else version
            return await asyncio.to_thread(self.weights.publish, state_dict, target)

    async def commit(self, version: int, *, step: int = 0, mean_reward: float | None = None) -> Committed:
        """Announce a published ``version``; Conflict if it is not published or not newer.

        ``step`` (the training step that produced it) and ``mean_reward`` (of the batch it was
        trained on) go with it: in a cluster the job's scheduler shows them as the RolloutJob's
        ``status.step`` and ``status.meanReward``.
        """
        if version <= self.committed:
            raise errors.Conflict(
                f"version {version} is not newer than the committed version {self.committed}"
            )
        store, prefix = self.weights.store, self.weights.prefix
        if not await asyncio.to_thread(store.exists, layout.manifest_key(prefix, version)):
            raise errors.Conflict(f"version {version} has no manifest under {prefix!r}: publish it first")
        aborted: Sequence[str] = ()
        if self.committer is not None:
            reply = await self.committer.commit_version(version, step=step, mean_reward=mean_reward)
            aborted = tuple(getattr(reply, "aborted_trajectory_ids", ()))
        self.committed = version
        return Committed(version, tuple(aborted))

    async def publish_and_commit(self, state_dict: Mapping[str, Any]) -> Committed:
        manifest = await self.publish(state_dict)
        return await self.commit(manifest.version)
