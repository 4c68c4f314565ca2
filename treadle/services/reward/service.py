"""Scoring with idempotency per trajectory id, a concurrency limit and a timeout; called by ``http_app``.

The gateway keeps no state that matters: the per-id cache (an LRU in memory) only makes retries
cheap and consistent, and a fresh replica recomputes the same score for the rule and code functions.
A second request for an id that is being scored joins the first; a request for a scored id with a
different input is a ``Conflict``. Failures and timeouts are not cached, so a retry runs again.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import json
import time

import prometheus_client

from treadle import errors, metrics
from treadle.services.reward import functions, protocol


class RewardService:
    def __init__(
        self,
        *,
        registry: prometheus_client.CollectorRegistry,
        resources: functions.Resources,
        max_concurrency: int = 64,
        timeout_s: float = 30.0,
        cache_size: int = 100_000,
    ) -> None:
        self.resources, self.timeout_s, self.cache_size = resources, timeout_s, cache_size
        self._limit = asyncio.Semaphore(max_concurrency)
        self._done: collections.OrderedDict[str, tuple[str, protocol.ScoreResult]] = collections.OrderedDict()
        self._running: dict[str, tuple[str, asyncio.Future[protocol.ScoreResult]]] = {}
        self._requests = prometheus_client.Counter(
            metrics.REWARD_REQUESTS_TOTAL, "Score requests", ["reward_fn", "outcome"], registry=registry
        )
        self._latency = prometheus_client.Histogram(
            metrics.REWARD_LATENCY_SECONDS, "Scoring latency (computed, not cached)", ["reward_fn"],
            registry=registry, buckets=(0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60),
        )  # fmt: skip
        self._inflight = prometheus_client.Gauge(
            metrics.REWARD_INFLIGHT, "Scores computing", registry=registry
        )
        self._failures = prometheus_client.Counter(
            metrics.REWARD_FAILURES_TOTAL,
            "Scores that raised or timed out",
            ["reward_fn", "kind"],
            registry=registry,
        )

    async def score(self, req: protocol.ScoreRequest) -> protocol.ScoreResult:
        fn = functions.resolve(req.reward_fn, self.resources)  # SpecError before anything is stored
        key = _fingerprint(req)
        label = req.reward_fn if not req.reward_fn.startswith("py:") else "py"
        if (hit := self._done.get(req.trajectory_id)) is not None:
            self._same_input(req.trajectory_id, hit[0], key)
            self._done.move_to_end(req.trajectory_id)
            self._requests.labels(label, "cached").inc()
            return hit[1].model_copy(update={"cached": True})
        if (running := self._running.get(req.trajectory_id)) is not None:
            self._same_input(req.trajectory_id, running[0], key)
            result = await asyncio.shield(running[1])
            return result.model_copy(update={"cached": True})
        future: asyncio.Future[protocol.ScoreResult] = asyncio.get_running_loop().create_future()
        self._running[req.trajectory_id] = (key, future)
        try:
            result = await self._compute(fn, req, label)
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # joined callers re-raise it; mark it retrieved for the lone caller
            raise
        finally:
            del self._running[req.trajectory_id]
        future.set_result(result)
        self._done[req.trajectory_id] = (key, result)
        while len(self._done) > self.cache_size:
            self._done.popitem(last=False)
        return result

    async def _compute(
        self, fn: functions.Fn, req: protocol.ScoreRequest, label: str
    ) -> protocol.ScoreResult:
        async with self._limit:
            self._inflight.inc()
            started = time.perf_counter()
            try:
                reward, details = await asyncio.wait_for(fn(req, self.resources), self.timeout_s)
            except TimeoutError as exc:
                self._failures.labels(label, "timeout").inc()
                raise TimeoutError(f"reward {req.reward_fn!r} timed out after {self.timeout_s}s") from exc
            except errors.SpecError:
                self._requests.labels(label, "bad_input").inc()
                raise
            except errors.Unavailable:
                self._failures.labels(label, "unavailable").inc()
                raise
            except Exception as exc:
                self._failures.labels(label, "error").inc()
                raise errors.Unavailable(
                    f"reward {req.reward_fn!r} failed: {type(exc).__name__}: {exc}"
                ) from exc
            finally:
                self._inflight.dec()
            self._latency.labels(label).observe(time.perf_counter() - started)
        self._requests.labels(label, "scored").inc()
        return protocol.ScoreResult(
            trajectory_id=req.trajectory_id, reward=reward, details=details, cached=False
        )

    @staticmethod
    def _same_input(trajectory_id: str, seen: str, key: str) -> None:
        if seen != key:
            raise errors.Conflict(f"trajectory {trajectory_id!r} was already scored with a different request")


def _fingerprint(req: protocol.ScoreRequest) -> str:
    raw = json.dumps(req.model_dump(exclude={"trajectory_id"}), sort_keys=True, default=str)
    return hashlib.blake2b(raw.encode(), digest_size=16).hexdigest()
