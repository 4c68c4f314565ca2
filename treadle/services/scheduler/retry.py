"""Retries with exponential backoff for the scheduler's calls to environments, agents and the reward
gateway; ``trajectory.Failed`` with the reason once a call cannot succeed.

Used by the turn loop (``turns``) and the reward stage (``reward``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from treadle import errors
from treadle.api import jobconfig
from treadle.services.scheduler import stats, trajectory

T = TypeVar("T")
RETRYABLE = (errors.Unavailable, TimeoutError)


class Retrier:
    def __init__(self, settings: jobconfig.Settings, tally: stats.Tally, clock: Callable[[], float]) -> None:
        self.settings = settings
        self.tally = tally
        self.metrics = tally.metrics
        self.clock = clock
        self._attempts = {
            "environment": settings.env_attempts,
            "reward": settings.reward_attempts,
            "generation": settings.generation_attempts,
            # Placement is asked once; only its ``Unavailable`` (no worker ready) is waited out.
            "placement": 1,
        }
        """Calls per stage before a trajectory fails; built once, not in every ``call`` frame (held
        across each awaited call, so young GC collections walked one per trajectory)."""

    def _unavailable_budget(self, stage: str, call: str) -> float:
        """Seconds ``Unavailable`` is waited out: the reward gateway's cold start, an environment
        session's open (no env pod ready yet) and placement with no inference worker ready (engines
        loading). Not an env step: its session lives in one pod, and a step to a pod that went away
        can never succeed."""
        name = self._budget_name(stage, call)
        return float(getattr(self.settings, name)) if name else 0.0

    @staticmethod
    def _budget_name(stage: str, call: str) -> str:
        return {
            ("reward", call): "reward_unavailable_s",
            ("environment", "open"): "env_open_unavailable_s",
            ("placement", call): "worker_unavailable_s",
        }.get((stage, call), "")

    async def call(
        self,
        t: trajectory.Traj,
        stage: str,
        call: str,
        fn: Callable[[], Awaitable[T]],
        *,
        account: bool = True,
    ) -> T:
        """``fn()``, retried with backoff on ``Unavailable``/timeouts; ``Failed`` with the reason after.

        ``account`` adds the time to ``stage`` (generation is timed by its caller, placement included).
        """
        attempts = self._attempts[stage]
        delay = self.settings.backoff_s
        budget = self._unavailable_budget(stage, call)
        unavailable_since: float | None = None
        attempt = 0  # calls that count against ``attempts`` (not those waited out under ``budget``)
        while True:
            began = self.clock()
            try:
                return await fn()
            except RETRYABLE as exc:
                if stage == "environment":
                    self.metrics.env_failures.labels(call).inc()
                if budget > 0 and isinstance(exc, errors.Unavailable):
                    # A gateway scaled to zero, or an env pool still starting, has no endpoint until
                    # its first pod is ready (tens of seconds): wait for it up to the budget rather
                    # than for a count of attempts.
                    now = self.clock()
                    unavailable_since = began if unavailable_since is None else unavailable_since
                    if now - unavailable_since >= budget:
                        raise trajectory.Failed(
                            f"{stage}: {call}: unavailable for {now - unavailable_since:.1f}s, more than "
                            f"{self._budget_name(stage, call)}={budget:g}: {exc}"
                        ) from exc
                else:
                    attempt += 1
                if attempt >= attempts:
                    # A step's session lives in one env pod: that pod unreachable took the session.
                    raise trajectory.Failed(
                        f"{stage}: {call} failed after {attempt} attempts: {exc}",
                        restartable=(stage, call) == ("environment", "step"),
                    ) from exc
                if stage == "environment":
                    self.tally.env_retries += 1
            except errors.TreadleError as exc:
                if stage == "environment":
                    self.metrics.env_failures.labels(call).inc()
                # A server that no longer knows the session was restarted under it: the session is lost.
                lost = (stage, call) == ("environment", "step") and isinstance(exc, errors.NotFound)
                raise trajectory.Failed(f"{stage}: {call}: {exc}", restartable=lost) from exc
            finally:
                if account:
                    self.spent(t, stage, began)
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.settings.max_backoff_s)

    def spent(self, t: trajectory.Traj, stage: str, began: float) -> None:
        """Add the time since ``began`` to ``t``'s ``stage`` and to the stage histogram."""
        seconds = self.clock() - began
        t.stage[stage] += seconds
        self.metrics.stage_of(stage).observe(seconds)
