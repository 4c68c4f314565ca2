"""Live inter-agent rebalancing (FlexMARL §5.2): the loop that moves inference workers between agents.

Run by placement's process (``python -m treadle.services.placement``, every
``spec.rollout.rebalance.intervalSeconds`` of its job) and, in-process, by the integration tests.
Placement owns what the policy reads: which agent each worker serves, the turns assigned to it and
not released, and the loads its workers report.

Every ``interval_s`` the loop asks ``PlacementService.plan_rebalance`` for a move (the policy is
``treadle.policy.flexmarl.load_balance.rebalance``, default ``delta=5`` as in FlexMARL §8.1 and our
``per-instance`` rule, which settles where the paper's literal rule flips instances back and forth;
see ``bench/reports/flexmarl-analysis.md``). Placement moves at most ``rebalance_step`` workers per
poll (1 by default) and the loop lets ``settle_polls`` polls pass after a move before it measures
again: turns already queued on a worker stay there, so a move relieves the receiver only as new
turns arrive, and the rule's k (computed as if queues re-spread at once) overshoots. One move at a
time, each made safely:

1. **Drain.** ``plan_rebalance`` already marked the worker draining: placement assigns it no new
   turn, and its sticky trajectories go elsewhere on their next turn. The loop waits until every
   turn assigned to it has been released (``drain_timeout_s`` at most; then the move is abandoned
   and the worker goes back to its donor, untouched). No turn is cancelled, so none is lost.
2. **Swap** (``Swapper``): pause through the worker's agent (``mode=wait``: nothing is in flight by
   now, so nothing is aborted), load the receiver's current weights, set the engine's weight-version
   label to ``"<receiver>-<version>"``, resume through the agent (which re-reads the label, so every
   later token is tagged with the receiver's version) naming the receiver's pool, which the agent
   registers with from then on (so a restarted placement gets it back there).
3. **Re-home.** ``finish_move`` moves the worker to the receiver's pool; from then on only the
   receiver's turns are assigned to it. A turn's agent is the agent of the pool that served it, so
   a turn is never tagged with an agent whose weights did not produce it.

The weights: with real vLLM (``HttpSwapper(apply_weights=True)``, placement's default in a
cluster) the swap loads the receiver's version from the receiver's weight prefix
(``treadle.weights.layout.agent_prefix``; ``tests/slow/test_rebalance_vllm_weights.py``). With the
simulated engine (``treadle.services.fakevllm``, local mode) only the label moves.
A trainer's swap and a move never interleave on one worker: the worker's agent takes one swap at a
time and refuses a trainer's swap that expects the agent the worker served before it moved
(``agent.client.SwapContended``); local mode's simulated trainer swaps through the same sequence. In
a cluster each agent registers its engine's
address (``agent.reporter``: the pod's IP and vLLM's port); a worker registered without one is
never moved.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

import httpx

from treadle import errors
from treadle.services.agent import client as agent_client
from treadle.services.placement import service
from treadle.v1 import placement_pb2

log = logging.getLogger(__name__)
DRAIN_POLL_S = 0.02
DEFAULT_SETTLE_POLLS = 5
"""Polls skipped after a move (ours, not the paper's). Turns already queued on a worker stay there,
so the donor's and receiver's queues reflect the move only once those drain; measured at once they
still show the old imbalance, and the next poll would move workers back and forth."""


class Swapper(Protocol):
    async def swap(self, worker: placement_pb2.Worker, *, agent: str, version: int) -> object:
        """Make ``worker``'s engine serve ``agent``'s weights at ``version``; raise on failure.

        ``worker`` is the record as it will be once moved: its ``pool`` is the receiver's."""


class HttpSwapper:
    """``agent.client.swap`` to the receiver's label; loads its weights first only with ``apply_weights``.

    Used for moves (``Rebalancer``) and for new versions (``weights.WeightSync``)."""

    def __init__(
        self, *, timeout_s: float = 60.0, apply_weights: bool = False, token: str | None = None
    ) -> None:
        self.timeout_s = timeout_s
        self.apply_weights = apply_weights
        self.token = token

    async def swap(
        self, worker: placement_pb2.Worker, *, agent: str, version: int, expect_agent: str = ""
    ) -> agent_client.Swapped:
        return await agent_client.swap(
            worker.address, worker.engine_address, label=agent_client.label(agent, version),
            apply_version=version if self.apply_weights else None, agent=agent, expect_agent=expect_agent,
            timeout_s=self.timeout_s, pool=worker.pool, token=self.token,
        )  # fmt: skip

    async def prefetch(self, worker: placement_pb2.Worker, *, version: int) -> None:
        if not self.apply_weights:
            return  # the SIMULATED engine has nothing to pull
        async with httpx.AsyncClient(timeout=self.timeout_s) as http:
            await agent_client.collective_rpc(
                http, worker.engine_address, "treadle_weights_prefetch", str(version)
            )


class Rebalancer:
    def __init__(
        self,
        svc: service.PlacementService,
        swapper: Swapper,
        *,
        interval_s: float = 1.0,
        settle_polls: int = DEFAULT_SETTLE_POLLS,
        drain_timeout_s: float = 120.0,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if not interval_s > 0:
            raise errors.SpecError("must be > 0", field="rebalance_interval_s", value=interval_s)
        if settle_polls < 0:
            raise errors.SpecError("must be >= 0", field="rebalance_settle_polls", value=settle_polls)
        self.settle_polls = settle_polls
        self._settling = 0
        self.svc = svc
        self.swapper = swapper
        self.interval_s = interval_s
        self.drain_timeout_s = drain_timeout_s
        self.sleep = sleep
        self.failed = 0
        """Moves abandoned (drain timed out or the swap failed); the worker went back to its donor."""

    async def run_forever(self) -> None:
        while True:
            await self.sleep(self.interval_s)
            try:
                await self.poll_once()
            except errors.TreadleError as exc:
                log.warning("rebalance poll failed: %s", exc)

    async def poll_once(self) -> int:
        """One poll; the workers moved (0 when the policy moved nothing, a move failed, or settling)."""
        if self._settling > 0:
            self._settling -= 1
            return 0
        move = self.svc.plan_rebalance()
        if move is None:
            return 0
        log.info("rebalance: moving %s from %s to %s", list(move.instance_ids), move.donor, move.receiver)
        done = sum(await asyncio.gather(*(self._move(wid, move.receiver) for wid in move.instance_ids)))
        if done:
            self._settling = self.settle_polls
        return done

    async def _move(self, worker_id: str, receiver: str) -> bool:
        loaded: int | None = None
        try:
            if await self._drained(worker_id):
                version = self.svc.agent_version(receiver)  # read now: the freshest the receiver serves
                worker = self.svc.worker_info(worker_id)
                # The agent registers with this pool from now on, even with a placement that forgot the move.
                worker.pool = self.svc.receiver_pool(worker_id)
                await self.swapper.swap(worker, agent=receiver, version=version)
                loaded = version
            else:
                log.warning(
                    "rebalance: %s did not drain in %.0fs; move abandoned", worker_id, self.drain_timeout_s
                )
        except errors.TreadleError as exc:
            log.warning("rebalance: swap of %s to %s failed: %s", worker_id, receiver, exc)
        finally:
            self.svc.finish_move(worker_id, loaded=loaded)
        if loaded is None:
            self.failed += 1
        return loaded is not None

    async def _drained(self, worker_id: str) -> bool:
        waited = 0.0
        while self.svc.outstanding(worker_id) > 0:
            if waited >= self.drain_timeout_s:
                return False
            await self.sleep(DRAIN_POLL_S)
            waited += DRAIN_POLL_S
        return True
