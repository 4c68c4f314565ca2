"""Swap a published weight version into every engine, under suspend; the trainer's ``Swapper``.

Called by ``treadle.trainer.loop`` between iterations. Per replica (engine + its inference agent):

1. ``prefetch(v)`` right after publishing: with real vLLM the worker extension
   (``treadle.weights.vllm_extension``) pulls and validates every bucket of ``v`` on a background
   thread while generation goes on;
2. ``swap(v)``: pause through the agent with ``mode="wait"``, apply ``v`` through vLLM's
   weight-update routes and Treadle's weight-transfer engine (``treadle.weights.transfer_engine``,
   which refuses a missing, corrupt or mismatched version before touching the model: the route
   answers 500 and the engine keeps serving the previous version; it also re-packs the tied LM head,
   which vLLM CPU's reload leaves stale), drop the prefix cache
   computed with the old weights, set the engine's weight-version label, resume through the agent
   (which re-reads the label, so the next request is tagged with ``v``).

In-flight partial responses across a version change: we drain them (``pause?mode=wait``) rather
than keep them (``keep``, whose tokens after the swap would come from new weights on a KV cache
computed with old ones) or abort them (``abort``, which throws the tokens away and re-generates
the turn). Draining finishes every running request on the weights that started it, so the
version the agent records for each token (the label at request start) is exactly the version that
produced it; nothing is re-prefilled and nothing is lost. The price is the swap waiting for the
longest running request, which is small for the toy's short turns; for long generations ``keep``
with a re-prefill would be the better trade and the agent's tags would then be conservative (never
newer than the truth). The scheduler is suspended meanwhile, so no new trajectory starts.

A trainer of one agent of a multi-agent job publishes under that agent's prefix
(``treadle.weights.layout.agent_prefix``) and passes ``agent``: each engine then applies the
version from that agent's versions. Placement may move one of its engines to another agent at any
time (FlexMARL rebalancing), so every swap says which agent the trainer expects the engine to serve;
the engine's inference agent refuses a swap while another (a move) is under way or once the engine
serves another agent (``agent.client.SwapContended``). The trainer then reads the worker's agent again: one
that moved away is left alone (``moved``) until it serves this agent again; one still ours is tried
again after a moment (the move that held it was abandoned).

The simulated engine cannot load weights; with ``extension=False`` only the label moves (the
integration tests use it to check the loop's mechanics, never its learning).

This swapper needs every engine's and agent's address (``treadle train``'s local stack has them).
In a cluster the trainer uses ``treadle.client.swapper.ClusterSwapper`` instead: placement, which
knows every registered worker, runs the same sequence over all of them (``docs/WEIGHT_SYNC.md``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Sequence

import httpx

from treadle import errors
from treadle.services.agent import client as agent_client

log = logging.getLogger(__name__)
CONTENDED_RETRIES = 10
CONTENDED_WAIT_S = 1.0
"""Between tries of a swap refused while another was under way: a move's swap takes about as long
as a version load; its drain happened before it took the worker."""


@dataclasses.dataclass(frozen=True)
class Replica:
    worker_id: str
    engine_url: str
    agent_url: str


class EngineSwapper:
    def __init__(
        self,
        replicas: Sequence[Replica],
        *,
        extension: bool,
        timeout_s: float = 300.0,
        agent: str = "",
        contended_retries: int = CONTENDED_RETRIES,
        contended_wait_s: float = CONTENDED_WAIT_S,
        token: str | None = None,
    ) -> None:
        """``token``: the job's (``treadle.auth``), sent to every inference agent."""
        if not replicas:
            raise errors.SpecError("need at least one replica", field="replicas")
        self.replicas = list(replicas)
        self.agent = agent
        self.token = token
        self.contended_retries = contended_retries
        self.contended_wait_s = contended_wait_s
        self.moved: dict[str, str] = {}
        """Replicas whose engine serves another agent now (the agent it serves), as of the last swap."""
        self.extension = extension
        self.timeout_s = timeout_s
        self.served: dict[str, int] = {r.worker_id: 0 for r in replicas}
        """Version each replica serves, as of its last successful swap."""

    async def prefetch(self, version: int) -> None:
        if not self.extension:
            return
        async with httpx.AsyncClient(timeout=self.timeout_s) as http:
            for r in self.replicas:
                # A failed prefetch is not an error: apply pulls (and validates) by itself.
                try:
                    await agent_client.collective_rpc(
                        http, r.engine_url, "treadle_weights_prefetch", str(version)
                    )
                except agent_client.SwapRefused as exc:
                    log.warning("prefetch of v%d on %s failed: %s", version, r.worker_id, exc)

    async def swap(self, version: int) -> None:
        results = await asyncio.gather(
            *(self._swap_one(r, version) for r in self.replicas), return_exceptions=True
        )
        failed = [(r.worker_id, e) for r, e in zip(self.replicas, results, strict=True) if e is not None]
        if failed:
            raise agent_client.SwapRefused(
                f"version {version} not applied on {', '.join(f'{w}: {e}' for w, e in failed)}"
            )

    async def _swap_one(self, r: Replica, version: int) -> None:
        for attempt in range(self.contended_retries + 1):
            try:
                await agent_client.swap(
                    r.agent_url, r.engine_url, label=str(version),
                    apply_version=version if self.extension else None, agent=self.agent,
                    expect_agent=self.agent, timeout_s=self.timeout_s, token=self.token,
                )  # fmt: skip
            except agent_client.SwapContended:
                serving = await self._serving(r)
                if self.agent and serving and serving != self.agent:
                    log.info("%s serves agent %s now; v%d of %s not applied", r.worker_id, serving, version,
                             self.agent)  # fmt: skip
                    self.moved[r.worker_id] = serving
                    return
                if attempt == self.contended_retries:
                    raise
                await asyncio.sleep(self.contended_wait_s)
            else:
                self.moved.pop(r.worker_id, None)
                self.served[r.worker_id] = version
                return

    async def _serving(self, r: Replica) -> str:
        """The agent whose weights the replica's engine serves, as its inference agent says."""
        client = agent_client.AgentClient(r.agent_url, timeout_s=self.timeout_s, token=self.token)
        try:
            return (await client.load()).agent
        finally:
            await client.aclose()
