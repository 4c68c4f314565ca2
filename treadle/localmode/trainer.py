"""The SIMULATED TRAINER of local mode (no gradient step): RollArt's per-iteration loop over the
buffer, the scheduler and the engines' labels, restartable, and what it did (``TrainerLog``).

Run by ``treadle.localmode.run.drive`` beside a local stack, or as a process of its own by the fault
suite (``tests/integration/faults/trainer_proc.py``), which kills and restarts it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

from treadle import errors
from treadle.services.agent import client as agent_client
from treadle.services.buffer import client as buffer_client
from treadle.services.placement import client as placement_client
from treadle.services.scheduler import client as scheduler_client
from treadle.v1 import buffer_pb2

if TYPE_CHECKING:  # run imports this module; the stack's addresses are all it takes from there
    from treadle.localmode.run import Services

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclasses.dataclass
class TrainerLog:
    version: int = 0
    batches: int = 0
    trajectories: int = 0
    evicted_groups: int = 0
    staleness: list[int] = dataclasses.field(default_factory=list)
    trained: list[str] = dataclasses.field(default_factory=list)
    """Every trajectory (row) id of every acked batch, in order: a repeat is a row trained twice."""


TRAINER_LEASE_S = 10.0
"""The simulated trainer's lease on a batch: what a trainer that died holding it leaves for this long."""
TRAINER_WAIT_S = 120.0
"""How long the simulated trainer waits out an unreachable buffer or scheduler before giving up."""


async def waiting(what: str, call: Callable[[], Awaitable[T]], *, budget_s: float = TRAINER_WAIT_S) -> T:
    """``call()``, retried with backoff (0.1 s doubling to 2 s) while it is ``Unavailable``, saying what
    it waits for; the last error after ``budget_s`` seconds."""
    deadline = time.monotonic() + budget_s
    delay = 0.1
    while True:
        try:
            return await call()
        except errors.Unavailable as exc:
            if time.monotonic() + delay > deadline:
                raise
            log.warning("simulated trainer: waiting %.1fs for %s: %s", delay, what, exc)
        await asyncio.sleep(delay)
        delay = min(delay * 2, 2.0)


async def simulated_trainer(
    services: Services, *, batch_size: int, out: TrainerLog, agents: Sequence[str] = (),
    lease_s: float = TRAINER_LEASE_S,
) -> None:  # fmt: skip
    """RollArt's per-iteration protocol without a gradient step, until cancelled.

    Restartable: a trainer started again goes on from ``out.version`` (the scheduler's committed
    version, for a trainer that restarted) and trains no row twice. Each batch is acked as soon as it
    is taken, before the version trained on it is committed, as the reference trainer acks before
    its commit: a trainer killed after the commit and before the ack would get the batch again once
    its lease ended and train it a second time. Killed between the ack and the commit, its step dies
    with it (as any trainer's uncommitted update does) and no row comes back. A batch whose lease
    ended before the ack is left to be delivered again (its rows come back whole).

    With several ``agents``, FlexMARL's unified update: each agent's trainer takes ``batch_size`` rows
    from its own experience table, and once every agent has its batch all move to the next version
    together. Each engine's label then names the agent it serves now (``agent_client.label``), as
    placement lists it. Labels go through the swap sequence every weight change uses
    (``agent.client.swap``), expecting that agent: a worker placement is moving, or moved since the list was
    read, refuses it (``SwapContended``), and its move labels it with its new agent's version.
    """
    buffer = buffer_client.BufferClient(services.buffer, token=services.token)
    scheduler = scheduler_client.SchedulerClient(services.scheduler, token=services.token)
    placement = placement_client.PlacementClient(services.placement, token=services.token)
    tables = list(agents) or [""]

    async def relabel(wid: str, serves: str, version: int) -> None:
        with contextlib.suppress(agent_client.SwapContended):
            await agent_client.swap(
                services.agents[wid], services.engines[wid], label=agent_client.label(serves, version),
                apply_version=None, timeout_s=10.0, expect_agent=serves, token=services.token,
            )  # fmt: skip

    try:
        while True:
            got: dict[str, buffer_pb2.Batch] = {}
            while len(got) < len(tables):
                for agent in tables:
                    if agent not in got:
                        with contextlib.suppress(TimeoutError):
                            take = functools.partial(
                                buffer.get_batch, batch_size=batch_size, version=out.version, timeout_s=1.0,
                                agent=agent, lease_s=lease_s,
                            )  # fmt: skip
                            batch = await waiting("the buffer (GetBatch)", take)
                            if await _acked(buffer, batch):
                                got[agent] = batch
                                out.trained += [t.trajectory_id for t in batch.trajectories]
                                out.trajectories += len(batch.trajectories)
                                out.evicted_groups += batch.evicted_groups
                                out.staleness += [out.version - t.init_version for t in batch.trajectories]
            await waiting("the scheduler (Suspend)", scheduler.suspend)
            out.version += 1
            serving = {wid: "" for wid in services.engines}
            if agents:
                state = await placement.pool_state()
                serving = {w.worker.worker_id: w.agent for w in state.workers if not w.moving_to}
            await asyncio.gather(*(relabel(wid, serves, out.version) for wid, serves in serving.items()))
            await waiting(
                "the scheduler (CommitVersion)", functools.partial(scheduler.commit_version, out.version)
            )
            await waiting("the scheduler (Resume)", scheduler.resume)
            out.batches += len(got)
    finally:
        await buffer.aclose()
        await scheduler.aclose()
        await placement.aclose()


async def _acked(buffer: buffer_client.BufferClient, batch: buffer_pb2.Batch) -> bool:
    try:
        await waiting("the buffer (Ack)", functools.partial(buffer.ack, batch.batch_id))
    except errors.NotFound as exc:
        log.warning(
            "simulated trainer: batch %s not trained, it will be delivered again: %s", batch.batch_id, exc
        )
        return False
    return True
