"""An API quota held across several real env server processes (real Redis, a stand-in API on
127.0.0.1): the API never sees more calls at once than ``maxConcurrent``, no window holds more
requests than the quota (60 s, and the enforced 10 s sub-window), and no action fails for it."""

from __future__ import annotations

from pathlib import Path

import httpx

from treadle.policy.tangram import quota
from treadle.testing import fake_api
from treadle.testing import redis_server as redis_server_mod

RPM, CONCURRENT, SERVERS, PER_SERVER, SEARCHES = 60, 3, 3, 4, 2


async def test_several_env_servers_share_one_quota(
    redis_server: redis_server_mod.RedisServer, tmp_path: Path
) -> None:
    job = fake_api.search_job("quota-live", requests_per_minute=RPM, max_concurrent=CONCURRENT)
    limit = quota.limit(0, "web-search", requests_per_minute=RPM, max_concurrent=CONCURRENT)
    assert (limit.requests, limit.window_s) == (10, 10.0)
    with (
        fake_api.running(delay_s=0.2) as api,
        fake_api.env_servers(job, SERVERS, redis_url=redis_server.url, directory=tmp_path) as urls,
    ):
        failures = await fake_api.search_trajectories(
            urls, search_url=api.url, per_server=PER_SERVER, searches=SEARCHES
        )
        async with httpx.AsyncClient() as h:
            text = (await h.get(f"{urls[0]}/metrics")).text
    calls = SERVERS * PER_SERVER * SEARCHES  # 24: the window lets 10 through per 10 s
    assert failures == [] and len(api.arrivals) == calls
    assert api.max_in_flight <= CONCURRENT
    assert fake_api.most_in_window(api.arrivals, 60.0) <= RPM
    assert fake_api.most_in_window(api.arrivals, limit.window_s) <= limit.requests
    # the window bound: the third ten went no sooner than ~two windows after the first
    assert max(api.arrivals) - min(api.arrivals) >= 2 * limit.window_s - 1.0
    assert 'treadle_tangram_action_seconds_count{phase="queue",resource="api:web-search"}' in text
