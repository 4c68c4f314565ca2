"""An API quota across several env server processes: observed concurrency and rate against the limits.

Measured, on this machine: a real Redis, a stand-in search API on 127.0.0.1 (``--delay-s`` per call;
it records every arrival and the calls in flight), and ``--servers`` real
``python -m treadle.services.env`` processes of one job whose ``web-search`` quota is
``--rpm`` requests per minute and ``--max-concurrent`` calls at once. Each server runs ``--per-server``
trajectories at once, each ``--searches`` searches then an answer (``WebSearch`` example env).
Printed: the most calls the API saw at once, the most requests in any 60 s and in any enforced
sub-window (``treadle.policy.tangram.quota``: ``R / k`` per ``60 / k`` s), the mean rate, failed
steps, each beside its limit. The API itself is a stand-in; the quota, Redis and the env servers
are real.

Run: ``python bench/tangram_quota.py``; results in ``--out`` (config.json, results.json).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import tempfile
import time
from pathlib import Path

import benchcli

from treadle.policy.tangram import quota
from treadle.testing import fake_api, redis_server


@dataclasses.dataclass
class Config:
    servers: int = dataclasses.field(default=3, metadata={"help": "env server processes"})
    per_server: int = dataclasses.field(default=10, metadata={"help": "trajectories at once per server"})
    searches: int = dataclasses.field(default=3, metadata={"help": "search calls per trajectory"})
    rpm: int = dataclasses.field(default=60, metadata={"help": "quota: requests per minute"})
    max_concurrent: int = dataclasses.field(default=4, metadata={"help": "quota: calls at once"})
    delay_s: float = dataclasses.field(default=0.2, metadata={"help": "the stand-in API's latency"})
    out: str = dataclasses.field(default="bench-out/tangram_quota", metadata={"help": "output dir"})


async def measure(cfg: Config) -> dict[str, object]:
    job = fake_api.search_job("bench-quota", requests_per_minute=cfg.rpm, max_concurrent=cfg.max_concurrent)
    limit = quota.limit(0, "web-search", requests_per_minute=cfg.rpm, max_concurrent=cfg.max_concurrent)
    with (
        tempfile.TemporaryDirectory() as tmp,
        redis_server.redis_server() as redis,
        fake_api.running(delay_s=cfg.delay_s) as api,
        fake_api.env_servers(job, cfg.servers, redis_url=redis.url, directory=Path(tmp)) as urls,
    ):
        started = time.time()
        failures = await fake_api.search_trajectories(
            urls, search_url=api.url, per_server=cfg.per_server, searches=cfg.searches, timeout_s=600
        )
        elapsed = time.time() - started
    span = max(api.arrivals) - min(api.arrivals) if api.arrivals else 0.0
    return {
        "calls": len(api.arrivals), "failed_steps": len(failures), "elapsed_s": elapsed,
        "max_in_flight": api.max_in_flight, "max_concurrent": cfg.max_concurrent,
        "most_in_60s": fake_api.most_in_window(api.arrivals, 60.0), "rpm": cfg.rpm,
        "window_s": limit.window_s, "window_requests": limit.requests,
        "most_in_window": fake_api.most_in_window(api.arrivals, limit.window_s),
        "mean_rate_per_min": 60 * (len(api.arrivals) - 1) / span if span else 0.0,
    }  # fmt: skip


def main() -> None:
    cfg = benchcli.parse(Config, __doc__)
    r = asyncio.run(measure(cfg))
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(dataclasses.asdict(cfg), indent=2))
    (out / "results.json").write_text(json.dumps(r, indent=2))
    head = f"{r['calls']} calls from {cfg.servers} servers x {cfg.per_server} trajectories x {cfg.searches}"
    print(f"measured (real Redis and env servers; stand-in API): {head} searches in {r['elapsed_s']:.1f} s")
    print(f"  calls at once:        max {r['max_in_flight']:>4}   limit maxConcurrent {cfg.max_concurrent}")
    print(f"  requests in any 60 s: max {r['most_in_60s']:>4}   limit requestsPerMinute {cfg.rpm}")
    sub = f"requests in any {r['window_s']:g} s:"
    print(f"  {sub:<21} max {r['most_in_window']:>4}   enforced {r['window_requests']} (60 / k s, R / k)")
    print(f"  mean rate:            {r['mean_rate_per_min']:.1f} per minute, first call to last")
    print(f"  failed steps:         {r['failed_steps']}")


if __name__ == "__main__":
    main()
