"""The agent loads the version its worker should serve by itself (weight sync's repair path).

Driven by ``reporter.LoadReporter``: every answer to a load report may carry the version placement
wants this worker's agent to serve (``ReportLoadResponse.weight_version``, the last ``SwapWeights``
for it; withheld while placement's own fan-out is swapping this worker). When the engine serves
another version, the agent runs the same swap sequence as any caller (``agent.client.swap_through``,
pausing and resuming through its own service, so one swap at a time still holds): pause with
``mode=wait``, apply the version (real vLLM: validated before anything is loaded), relabel, resume.
That covers:

- a worker whose swap failed or timed out in placement's fan-out (its engine kept its previous
  version whole; this pulls again, every ``backoff_s`` doubling up to ``max_backoff_s``);
- an engine that (re)started, on the checkpoint: a load that failed after the model was modified
  exits the engine (``weights.loader``) and its container restarts; the agent sees its label back at
  the checkpoint's and loads the target. Until it does, placement gives it no turn once it is beyond
  the staleness bound (``PlacementService.current``);
- an agent that restarted in the middle of someone's swap, leaving its engine paused (found at
  start, ``AgentService.orphaned``): the sequence ends with a resume. With no target known it only
  resumes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Literal

import prometheus_client

from treadle import errors, metrics
from treadle.services.agent import client as agent_client
from treadle.services.agent import service

log = logging.getLogger(__name__)


class _OwnGate:
    """``agent_client.Gate`` over the agent's own service: its swap holds the worker like a caller's."""

    def __init__(self, svc: service.AgentService, on_resumed: Callable[[], None]) -> None:
        self.svc = svc
        self.on_resumed = on_resumed

    async def pause(self, mode: Literal["abort", "wait", "keep"] = "keep", *, expect_agent: str = "") -> str:
        return await self.svc.pause(mode, expect_agent=expect_agent)

    async def resume(self, pool: str = "", agent: str = "", *, swap_id: str = "") -> None:
        await self.svc.resume(agent=agent, swap_id=swap_id)
        self.on_resumed()


class Reloader:
    def __init__(
        self,
        svc: service.AgentService,
        *,
        registry: prometheus_client.CollectorRegistry,
        on_resumed: Callable[[], None] = lambda: None,
        timeout_s: float = 300.0,
        backoff_s: float = 2.0,
        max_backoff_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``on_resumed``: after the agent's own resume (``http_app`` records what the worker serves)."""
        self.svc = svc
        self.gate = _OwnGate(svc, on_resumed)
        self.timeout_s = timeout_s
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.clock = clock
        self.target: int | None = None
        self._wait = backoff_s
        self._not_before = 0.0
        self._task: asyncio.Task[None] | None = None
        self._reloads = prometheus_client.Counter(
            metrics.AGENT_WEIGHT_RELOADS_TOTAL,
            "Swaps the agent ran by itself to the version placement wants its worker to serve, by outcome",
            ["outcome"], registry=registry,
        )  # fmt: skip

    def want(self, target: int | None, *, weights_agent: str, apply: bool) -> None:
        """Placement's answer to a report: start a reload if the engine serves another version (or sits
        paused by a swap no one will resume) and none is under way or backing off."""
        self.target = target
        if self._task is not None and not self._task.done():
            return
        mismatch = target is not None and self.svc.version != target
        if not (self.svc.orphaned or mismatch) or not self.svc.healthy or self.svc.swapping:
            return
        if self.clock() < self._not_before:
            return
        self._task = asyncio.create_task(self._reload(target, weights_agent, apply), name="weights reload")

    async def _reload(self, target: int | None, weights_agent: str, apply: bool) -> None:
        what = "end a swap orphaned by the agent's restart" if target is None else f"load v{target}"
        log.info("%s: engine serves %r; reloading to %s", self.svc.worker_id, self.svc.label, what)
        try:
            if target is None:
                swap_id = await self.gate.pause("wait")
                await self.gate.resume(swap_id=swap_id)
            else:
                await agent_client.swap_through(
                    self.gate, str(self.svc.engine.base_url), label=agent_client.label(weights_agent, target),
                    apply_version=target if apply else None, agent=weights_agent, timeout_s=self.timeout_s,
                    where=self.svc.worker_id,
                )  # fmt: skip
        except agent_client.SwapContended:
            return  # a caller's swap holds the worker; the next report says whether it is still needed
        except errors.TreadleError as exc:
            self._reloads.labels("failed").inc()
            self._not_before = self.clock() + self._wait
            log.error(
                "%s: reload to %s failed (next try in %.0fs): %s", self.svc.worker_id, what, self._wait, exc
            )
            self._wait = min(self._wait * 2, self.max_backoff_s)
            return
        self._reloads.labels("loaded").inc()
        self.svc.orphaned = False
        self._wait = self.backoff_s
        log.info("%s: %s done", self.svc.worker_id, what)

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
