"""The API quota's Lua script on a real Redis, driven by a test clock (``now``): the concurrency cap,
FCFS order, the sliding window counted to each release, a dead pod's calls and tickets coming back."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable

import prometheus_client
import pytest
import redis.asyncio as aioredis

from treadle.policy.tangram import quota
from treadle.sandbox import cores
from treadle.services.env import quotas
from treadle.testing import redis_server as redis_server_mod

Make = Callable[[int, int], quotas.Quotas]
"""A quota on tool ``api`` with (requestsPerMinute, maxConcurrent), in a namespace of its own."""


@pytest.fixture
async def make(redis_server: redis_server_mod.RedisServer) -> AsyncIterator[Make]:
    client = aioredis.Redis.from_url(redis_server.url, protocol=2)

    def build(rpm: int, concurrent: int) -> quotas.Quotas:
        registry = prometheus_client.CollectorRegistry()
        return quotas.Quotas(
            client=client, namespace=f"test-{uuid.uuid4().hex}", registry=registry,
            limits=quota.limits([("api", rpm, concurrent)]), action_metrics=cores.ActionMetrics(registry),
            lease_s=30.0, waiter_ttl_s=10.0,
        )  # fmt: skip

    yield build
    await client.aclose()


async def test_concurrency_cap_then_fcfs_on_release(make: Make) -> None:
    q = make(600, 2)
    assert (await q.call("acquire", "api", "a", 1, now=0.0)).granted == 1
    assert (await q.call("acquire", "api", "b", 1, now=0.0)).granted == 1
    c = await q.call("acquire", "api", "c", 1, now=0.1)
    assert (c.granted, c.in_flight, c.queued) == (0, 2, 1)
    await q.call("release", "api", "a", 1, now=1.0)
    # d arrives after c and finds one free slot: c is first in line, d does not pass it
    assert (await q.call("acquire", "api", "d", 1, now=1.1)).granted == 0
    assert (await q.call("acquire", "api", "c", 1, now=1.2)).granted == 1
    assert (await q.call("acquire", "api", "d", 1, now=1.3)).granted == 0  # full again
    await q.call("release", "api", "b", 1, now=2.0)
    assert (await q.call("acquire", "api", "d", 1, now=2.1)).granted == 1


async def test_the_window_counts_a_request_until_window_s_after_its_release(make: Make) -> None:
    q = make(2, 8)  # 1 request per sliding 30 s
    assert q.limits["api"].requests == 1 and q.limits["api"].window_s == 30.0
    assert (await q.call("acquire", "api", "a", 1, now=0.0)).granted == 1
    blocked = await q.call("acquire", "api", "b", 1, now=0.5)
    assert blocked.granted == 0 and blocked.wait_s == 0  # in flight: no end known yet
    await q.call("release", "api", "a", 1, now=1.0)
    waiting = await q.call("acquire", "api", "b", 1, now=5.0)
    assert waiting.granted == 0 and waiting.wait_s == pytest.approx(26.0)
    assert (await q.call("acquire", "api", "b", 1, now=30.9)).granted == 0
    assert (await q.call("acquire", "api", "b", 1, now=31.1)).granted == 1


async def test_a_dead_holders_calls_come_back_after_the_lease(make: Make) -> None:
    q = make(600, 1)
    assert (await q.call("acquire", "api", "dead", 1, now=0.0)).granted == 1
    assert (await q.call("acquire", "api", "b", 1, now=29.0)).granted == 0
    renewed = await q.call("renew", "api", "b", 1, now=29.0)  # renewing what it does not hold: nothing
    assert renewed.granted == 0
    assert (await q.call("acquire", "api", "b", 1, now=30.5)).granted == 1


async def test_renewing_keeps_the_calls(make: Make) -> None:
    q = make(600, 1)
    assert (await q.call("acquire", "api", "a", 1, now=0.0)).granted == 1
    assert (await q.call("renew", "api", "a", 1, now=20.0)).granted == 1
    assert (await q.call("acquire", "api", "b", 1, now=35.0)).granted == 0  # lease now ends at 50
    assert (await q.call("acquire", "api", "b", 1, now=40.0)).granted == 0


async def test_a_dead_waiter_leaves_the_queue(make: Make) -> None:
    q = make(600, 1)
    assert (await q.call("acquire", "api", "a", 1, now=0.0)).granted == 1
    assert (await q.call("acquire", "api", "gone", 1, now=0.0)).granted == 0  # then its pod dies
    await q.call("release", "api", "a", 1, now=5.0)
    assert (await q.call("acquire", "api", "next", 1, now=6.0)).granted == 0  # "gone" is still first
    assert (await q.call("acquire", "api", "next", 1, now=10.5)).granted == 1  # its ticket lapsed at 10


async def test_several_calls_at_once_wait_for_room_for_all(make: Make) -> None:
    q = make(600, 3)
    assert (await q.call("acquire", "api", "a", 2, now=0.0)).granted == 1
    two = await q.call("acquire", "api", "b", 2, now=0.1)
    assert (two.granted, two.in_flight) == (0, 2)
    await q.call("release", "api", "a", 2, now=1.0)
    assert (await q.call("acquire", "api", "b", 2, now=1.1)).granted == 1


async def test_hold_with_redis_time_and_a_left_ticket(make: Make) -> None:
    q = make(600, 1)
    async with q.hold(["api", "unlimited-tool"]) as held:
        assert held == {"api": 1}
        assert (await q.call("acquire", "api", "other", 1)).granted == 0
        await q.call("leave", "api", "other", 1)
    assert (await q.call("acquire", "api", "other", 1)).granted == 1
