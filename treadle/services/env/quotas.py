"""API quotas of a job, enforced across all its env pods in Redis (ARL-Tangram, live).

Before the env service applies a step it asks the environment which tools the action calls
(``base.UsesTools``), turns them into amounts per quota (``treadle.policy.tangram.quota.demand``),
and holds them for the step: ``hold`` waits in each tool's FCFS queue, then the step runs, then the
calls are released. Tools are taken in name order, so two actions never wait on each other's.

The state of one tool is six keys under one hash tag, changed only by ``_SCRIPT`` (one Lua script,
so every admission is atomic across pods):

* ``q`` (zset, ticket -> arrival number) and ``amt`` (hash, ticket -> calls): the FCFS queue. A
  ticket is admitted when the calls of the tickets before it plus its own fit both the free
  concurrency and the free window (the Alg. 1 admission over two flat pools): nobody passes.
* ``seen`` (zset, ticket -> expiry): a waiter refreshes its ticket on every poll; a ticket whose
  pod died stops being refreshed and leaves the queue after ``waiter_ttl_s``.
* ``held`` (zset, call -> lease expiry): calls in flight. The holder renews every ``lease_s / 3``;
  a dead pod's calls come back when their lease runs out.
* ``win`` (zset, call -> end): requests in the window, ``+inf`` while in flight, then the release
  time (a lapsed lease: its expiry), dropped ``window_s`` after that (``quota`` module doc).
* ``seq``: the arrival counter.

Time is Redis's own clock (``TIME``), the same for every pod; tests pass ``now``. A waiter polls
every ``poll_s``, or sleeps until the window's oldest request leaves it when the window is what is
full. A wait longer than ``max_wait_s`` fails the step as ``Unavailable`` naming the tool (a quota
that frees nothing for that long is a broken API or a stuck holder, not a queue).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

import prometheus_client
import redis.asyncio as aioredis

from treadle import errors, metrics
from treadle.policy.tangram import quota
from treadle.sandbox import cores

_SCRIPT = """
local q, seen, amt, held, win, seq = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local op, token, n = ARGV[1], ARGV[2], tonumber(ARGV[3])
local concurrent, requests, window = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local lease, ttl, now = tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) + tonumber(t[2]) / 1000000
end
local dead = redis.call('ZRANGEBYSCORE', held, '-inf', '(' .. now, 'WITHSCORES')
for i = 1, #dead, 2 do
  redis.call('ZADD', win, 'XX', dead[i + 1], dead[i])
  redis.call('ZREM', held, dead[i])
end
redis.call('ZREMRANGEBYSCORE', win, '-inf', '(' .. (now - window))
for _, w in ipairs(redis.call('ZRANGEBYSCORE', seen, '-inf', '(' .. now)) do
  redis.call('ZREM', q, w)
  redis.call('ZREM', seen, w)
  redis.call('HDEL', amt, w)
end
local granted = 0
if op == 'acquire' then
  if not redis.call('ZSCORE', q, token) then
    redis.call('ZADD', q, redis.call('INCR', seq), token)
    redis.call('HSET', amt, token, n)
  end
  redis.call('ZADD', seen, now + ttl, token)
  local room = math.min(concurrent - redis.call('ZCARD', held), requests - redis.call('ZCARD', win))
  local rank = redis.call('ZRANK', q, token)
  if rank < room then
    local ahead = 0
    if rank > 0 then
      for _, w in ipairs(redis.call('ZRANGE', q, 0, rank - 1)) do
        ahead = ahead + tonumber(redis.call('HGET', amt, w) or '1')
      end
    end
    if ahead + n <= room then
      granted = 1
      redis.call('ZREM', q, token)
      redis.call('ZREM', seen, token)
      redis.call('HDEL', amt, token)
      for i = 1, n do
        redis.call('ZADD', held, now + lease, token .. '/' .. i)
        redis.call('ZADD', win, '+inf', token .. '/' .. i)
      end
    end
  end
elseif op == 'renew' then
  for i = 1, n do
    granted = granted + redis.call('ZADD', held, 'XX', 'CH', now + lease, token .. '/' .. i)
  end
elseif op == 'release' then
  for i = 1, n do
    if redis.call('ZREM', held, token .. '/' .. i) == 1 then
      redis.call('ZADD', win, 'XX', now, token .. '/' .. i)
    end
  end
elseif op == 'leave' then
  redis.call('ZREM', q, token)
  redis.call('ZREM', seen, token)
  redis.call('HDEL', amt, token)
end
local wait = 0
local oldest = redis.call('ZRANGE', win, 0, 0, 'WITHSCORES')
if redis.call('ZCARD', win) >= requests and #oldest > 0 then
  local ends = tonumber(oldest[2])
  if ends and ends < math.huge then
    wait = ends + window - now
  end
end
return {granted, redis.call('ZCARD', held), redis.call('ZCARD', win), tostring(wait), redis.call('ZCARD', q)}
"""


@dataclasses.dataclass(frozen=True)
class Reply:
    """What one script call saw, after its own change."""

    granted: int
    """acquire: 1 if admitted; renew: calls whose lease was extended."""
    in_flight: int
    window: int
    wait_s: float
    """Seconds until the window's oldest request leaves it, when the window is full (else 0)."""
    queued: int


class Quotas:
    """The job's API quotas as this pod sees them (module doc)."""

    def __init__(
        self,
        *,
        client: aioredis.Redis,
        namespace: str,
        limits: Mapping[str, quota.Limit],
        registry: prometheus_client.CollectorRegistry,
        action_metrics: cores.ActionMetrics,
        lease_s: float = 30.0,
        waiter_ttl_s: float = 10.0,
        poll_s: float = 0.05,
        max_wait_s: float = 900.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client, self.namespace, self.limits = client, namespace, dict(limits)
        self.lease_s, self.waiter_ttl_s, self.poll_s, self.max_wait_s = (
            lease_s,
            waiter_ttl_s,
            poll_s,
            max_wait_s,
        )
        self.clock = clock
        self.metrics = action_metrics
        self._script = client.register_script(_SCRIPT)
        self._in_flight = prometheus_client.Gauge(
            metrics.TANGRAM_QUOTA_IN_FLIGHT, "Calls of the tool in flight across the job", ["tool"],
            registry=registry,
        )  # fmt: skip
        self._window = prometheus_client.Gauge(
            metrics.TANGRAM_QUOTA_WINDOW_REQUESTS, "Requests of the tool in its current window", ["tool"],
            registry=registry,
        )  # fmt: skip

    def keys(self, tool: str) -> list[str]:
        base = f"{self.namespace}:tangram:quota:{{{tool}}}"
        return [f"{base}:{part}" for part in ("q", "seen", "amt", "held", "win", "seq")]

    async def call(self, op: str, tool: str, token: str, n: int, *, now: float | None = None) -> Reply:
        """One run of the script (``now``: a test's clock instead of Redis's)."""
        q = self.limits[tool]
        args: list[Any] = [
            op,
            token,
            n,
            q.concurrent,
            q.requests,
            q.window_s,
            self.lease_s,
            self.waiter_ttl_s,
        ]
        args.append("" if now is None else repr(now))
        raw = await self._script(keys=self.keys(tool), args=args)
        reply = Reply(int(raw[0]), int(raw[1]), int(raw[2]), float(raw[3]), int(raw[4]))
        self._in_flight.labels(tool).set(reply.in_flight)
        self._window.labels(tool).set(reply.window)
        self.metrics.queued.labels(_resource(tool)).set(reply.queued)
        return reply

    @contextlib.asynccontextmanager
    async def hold(self, tools: Sequence[str]) -> AsyncIterator[dict[str, int]]:
        """Hold the calls of one action for the body (FCFS per tool, in tool name order)."""
        want = quota.demand(tools, self.limits)
        if not want:
            yield want
            return
        token, asked = uuid.uuid4().hex, self.clock()
        taken: list[tuple[str, int]] = []
        try:
            for tool, n in want.items():
                await self._acquire(tool, token, n)
                taken.append((tool, n))
                self.metrics.units.labels(_resource(tool)).inc(n)
            granted = self.clock()
            renewing = asyncio.create_task(self._renew(token, taken))
            try:
                yield want
            finally:
                renewing.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await renewing
                ran = self.clock() - granted
        finally:
            for tool, n in taken:
                await self.call("release", tool, token, n)
        for tool, _ in taken:
            self.metrics.phases(
                _resource(tool), queue_s=granted - asked, execution_s=ran, total_s=self.clock() - asked
            )

    async def _acquire(self, tool: str, token: str, n: int) -> None:
        deadline = self.clock() + self.max_wait_s
        try:
            while not (reply := await self.call("acquire", tool, token, n)).granted:
                if self.clock() > deadline:
                    raise errors.Unavailable(
                        f"the {tool!r} quota admitted nothing for {self.max_wait_s:g} s "
                        f"({reply.in_flight} calls in flight, {reply.window} in the window)"
                    )
                await asyncio.sleep(max(self.poll_s, min(reply.wait_s, self.waiter_ttl_s / 2)))
        except BaseException:
            with contextlib.suppress(Exception):  # a lost ticket leaves the queue after waiter_ttl_s anyway
                await asyncio.shield(self.call("leave", tool, token, n))
            raise

    async def _renew(self, token: str, taken: Sequence[tuple[str, int]]) -> None:
        while True:
            await asyncio.sleep(self.lease_s / 3)
            for tool, n in taken:
                await self.call("renew", tool, token, n)


def _resource(tool: str) -> str:
    return f"api:{tool}"
