"""The trainer's ``Swapper`` in a cluster: placement swaps every inference worker to a version.

A trainer in the job (or outside it, with placement's address) builds it over placement's client::

    from treadle.client import swapper
    from treadle.services.placement import client as placement_client

    sync = swapper.ClusterSwapper(placement_client.PlacementClient(addr, token=token), agent="")
    await sync.prefetch(v)   # right after publishing v: workers pull it while generating
    ...
    await sync.swap(v)       # under the scheduler's suspend, before committing v

It is ``treadle.trainer.loop.Swapper`` (``prefetch(version)`` / ``swap(version)``), the cluster's
counterpart of ``treadle.trainer.engines.EngineSwapper``, which swaps engines it was handed the
addresses of (``treadle train``'s local stack). Here placement runs the fan-out
(``services.placement.weightsync``): it knows every registered worker, bounds the swap in time and
answers per worker. ``swap`` raises when no worker serves the version afterwards and one refused
it or ran out of time (or none is registered): a worker that failed keeps its previous version
whole, placement keeps it out of rotation once it falls beyond the staleness bound, and its agent
loads the version by itself; ``last`` holds the per-worker answer. Workers placement reports
``lost`` (their pod deleted) or ``unreachable`` never hold a swap up: with every worker of a
one-replica pool gone, the version is still committed and the replacement pod loads it at start,
so a deleted inference pod costs the trainer seconds, not the swap's deadline.
A trainer of one agent of a multi-agent job passes ``agent``: only that agent's workers swap, each
to that agent's version.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

from treadle import errors

log = logging.getLogger(__name__)
DEFAULT_TIMEOUT_S = 300.0
AWAY = ("lost", "unreachable")
"""Outcomes of workers placement did not wait for: they (or their replacements) load the version
themselves once back, and none of them serves the previous version meanwhile."""


class WorkerOutcome(Protocol):
    @property
    def worker_id(self) -> str: ...

    @property
    def outcome(self) -> str:
        """``swapped``, ``failed``, ``timeout``, ``unreachable``, ``lost``, ``moved``, or ``started`` for a
        prefetch."""

    @property
    def error(self) -> str: ...


class Outcome(Protocol):
    @property
    def workers(self) -> Sequence[WorkerOutcome]: ...


class WeightSync(Protocol):
    """What the swapper needs from placement (``services.placement.client.PlacementClient``)."""

    async def prefetch_weights(self, version: int, *, agent: str = "") -> Outcome: ...

    async def swap_weights(
        self, version: int, *, agent: str = "", timeout_s: float = DEFAULT_TIMEOUT_S
    ) -> Outcome: ...


class SwapIncomplete(errors.Unavailable):
    """No inference worker serves the version: do not commit it."""


class ClusterSwapper:
    def __init__(
        self, placement: WeightSync, *, agent: str = "", timeout_s: float = DEFAULT_TIMEOUT_S
    ) -> None:
        self.placement = placement
        self.agent = agent
        self.timeout_s = timeout_s
        self.last: Outcome | None = None
        """Placement's per-worker answer to the last ``swap``."""

    async def prefetch(self, version: int) -> None:
        """Start pulling ``version`` on every worker; a failed prefetch only costs the swap a pull."""
        done = await self.placement.prefetch_weights(version, agent=self.agent)
        for w in done.workers:
            if w.outcome != "started":
                log.warning("prefetch of v%d on %s: %s %s", version, w.worker_id, w.outcome, w.error)

    async def swap(self, version: int) -> None:
        """Every worker to ``version``; ``SwapIncomplete`` unless one serves it afterwards or every worker
        that missed it is away (``AWAY``)."""
        done = await self.placement.swap_weights(version, agent=self.agent, timeout_s=self.timeout_s)
        self.last = done
        missed = [w for w in done.workers if w.outcome not in ("swapped", "moved")]
        away = bool(missed) and all(w.outcome in AWAY for w in missed)
        if not any(w.outcome == "swapped" for w in done.workers) and not away:
            said = (
                "; ".join(f"{w.worker_id}: {w.outcome} {w.error}" for w in missed) or "no worker registered"
            )
            raise SwapIncomplete(f"version {version} reached no inference worker ({said})")
        for w in missed:
            log.warning(
                "v%d not on %s yet (%s: %s); its agent loads it", version, w.worker_id, w.outcome, w.error
            )
