"""One trajectory in flight, as every stage of the scheduler sees it (the turn loop owns them)."""

from __future__ import annotations

import asyncio
import dataclasses

from treadle.policy import registry
from treadle.services.placement import protocol as placement_protocol
from treadle.services.scheduler import protocol, stats
from treadle.v1 import common_pb2


class Failed(Exception):
    """The trajectory cannot go on; ``str()`` is the reason stored with it. ``restartable``: through no
    fault of the policy, and with nothing of it worth keeping (its environment session went away with
    an unreachable env server), so running it again from its start loses nothing."""

    def __init__(self, reason: str, *, restartable: bool = False) -> None:
        super().__init__(reason)
        self.restartable = restartable


@dataclasses.dataclass
class Traj:
    tid: str
    work: protocol.Work
    init_version: int
    task: asyncio.Task[None] | None = None
    worker: placement_protocol.Assignment | None = None
    abort_reason: str = ""
    turns: list[common_pb2.Turn] = dataclasses.field(default_factory=list)
    stage: dict[str, float] = dataclasses.field(default_factory=lambda: dict.fromkeys(stats.STAGES, 0.0))
    started: float = 0.0
    seq: int = 0
    """Admission order (the FIFO tie-break of the ranking)."""
    tokens_so_far: int = 0
    step_tokens: list[int] = dataclasses.field(default_factory=list)
    predicted_remaining: float = 0.0
    predictions: list[tuple[int, float]] = dataclasses.field(default_factory=list)
    """(tokens so far, predicted remaining) of every prediction, scored when the trajectory completes."""
    preemptions: int = 0
    restartable: bool = False
    """It failed as ``Failed.restartable`` says: the scheduler may run it again from its start."""
    placed: asyncio.Task[None] | None = None
    """Batch placement of its admission round; its first turn waits for it."""
    releasing: asyncio.Task[None] | None = None
    """Placement release of its last turn, in flight during the tool call; the next turn waits for it."""

    def described(self, rank: int, state: str) -> protocol.TrajectoryState:
        """Its row in ``ListTrajectories``: ``rank`` in the policy's order, ``state`` at the gate."""
        return protocol.TrajectoryState(
            trajectory_id=self.tid, group_id=self.work.group_id, task=self.work.task.name, rank=rank,
            predicted_remaining=self.predicted_remaining, tokens_so_far=self.tokens_so_far,
            turns=len(self.turns), worker_id=self.worker.worker_id if self.worker else "", state=state,
            preemptions=self.preemptions,
        )  # fmt: skip

    def released(self, task: asyncio.Task[None]) -> None:
        """Done callback of ``releasing``: forget it once it succeeded, so the finished task (its
        coroutine, context and request) is freed now, not held through the tool call, where every
        young GC collection walked it. A failed one stays, for the next turn to raise."""
        if self.releasing is task and not task.cancelled() and task.exception() is None:
            self.releasing = None

    def queued(self) -> registry.QueuedTurn:
        """Its next turn as the scheduling policy ranks it."""
        return registry.QueuedTurn(
            self.tid,
            self.seq,
            len(self.turns),
            self.work.task.name,
            self.predicted_remaining,
            self.tokens_so_far,
        )
