"""A local stand-in for a rate-limited external API (a web search) on 127.0.0.1, and env servers
that run searching trajectories against it under a job's quota.

``running`` answers ``GET /search?q=...`` after ``delay_s`` and records when each request arrived
and how many were in flight, so a test or benchmark can hold the observed concurrency and request
rate against the quota. ``env_servers`` starts real ``python -m treadle.services.env`` processes
from a job file (as the operator's pods and local mode start them, Redis address and key prefix
as variables); ``search_trajectories`` runs the example ``WebSearch`` environment on them over the
env service's HTTP API. Used by the API-quota integration test and ``bench/tangram_quota.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import http.server
import json
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx

from treadle.api import env_vars, jobconfig, v1alpha1
from treadle.testing import procs

WEB_SEARCH_ENV = "py:treadle.services.env.examples:WebSearch"


@dataclasses.dataclass
class Api:
    url: str
    delay_s: float
    arrivals: list[float] = dataclasses.field(default_factory=list)
    """Wall-clock arrival of each request (``time.time``), in arrival order."""
    in_flight: int = 0
    max_in_flight: int = 0
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)

    def enter(self) -> None:
        with self.lock:
            self.arrivals.append(time.time())
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)

    def leave(self) -> None:
        with self.lock:
            self.in_flight -= 1


def most_in_window(times: Sequence[float], window_s: float) -> int:
    """The most of ``times`` inside any half-open window ``[t, t + window_s)``."""
    ordered, best, lo = sorted(times), 0, 0
    for hi, t in enumerate(ordered):
        while ordered[lo] <= t - window_s:
            lo += 1
        best = max(best, hi - lo + 1)
    return best


@contextlib.contextmanager
def running(delay_s: float = 0.2) -> Iterator[Api]:
    """Serve the stand-in on a free 127.0.0.1 port (one thread per request) until the block exits."""
    api: Api | None = None

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            assert api is not None
            api.enter()
            try:
                time.sleep(api.delay_s)
                query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query).get("q", [""])[0]
                body = json.dumps({"results": [f"a result for {query}"]}).encode()
            finally:
                api.leave()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            return None

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    api = Api(url=f"http://127.0.0.1:{server.server_address[1]}", delay_s=delay_s)
    thread = threading.Thread(target=server.serve_forever, name="fake-api", daemon=True)
    thread.start()
    try:
        yield api
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def search_job(name: str, *, requests_per_minute: int, max_concurrent: int) -> v1alpha1.RolloutJob:
    """A job whose one task runs ``WebSearch`` under a ``web-search`` quota."""
    spec = {
        "agents": [{"name": "a", "model": "m"}],
        "pools": [{"name": "p", "agent": "a", "accelerator": "H100"}],
        "tasks": [{"name": "search", "agents": ["a"], "environment": WEB_SEARCH_ENV, "reward": "exact"}],
        "externalResources": {
            "apiQuotas": [
                {
                    "tool": "web-search",
                    "requestsPerMinute": requests_per_minute,
                    "maxConcurrent": max_concurrent,
                }
            ]
        },
    }
    return v1alpha1.RolloutJob(metadata={"name": name}, spec=v1alpha1.parse_spec(spec))


def _healthy(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


@contextlib.contextmanager
def env_servers(
    job: v1alpha1.RolloutJob, count: int, *, redis_url: str, directory: Path
) -> Iterator[list[str]]:
    """``count`` env server processes of ``job`` on 127.0.0.1; yields their URLs."""
    path = directory / "job.json"
    path.write_text(jobconfig.job_file(job))
    env = {
        env_vars.CONFIG: str(path), env_vars.JOB: job.name, env_vars.REDIS_URL: redis_url,
        env_vars.KEY_PREFIX: f"bench/{job.name}",
    }  # fmt: skip
    with contextlib.ExitStack() as stack:
        urls = []
        for i in range(count):
            port = procs.free_port()
            argv = [sys.executable, "-m", "treadle.services.env", "--host", "127.0.0.1", "--port", str(port)]
            stack.enter_context(
                procs.running(f"env-{i}", argv, functools.partial(_healthy, port), env=env, timeout=60)
            )
            urls.append(f"http://127.0.0.1:{port}")
        yield urls


async def search_trajectories(
    urls: Sequence[str], *, search_url: str, per_server: int, searches: int, timeout_s: float = 120.0
) -> list[str]:
    """Run ``per_server`` trajectories on each server at once: ``searches`` search steps, then an
    answer. Returns the failures (empty: every step succeeded and every search got results)."""
    failures: list[str] = []

    async def trajectory(h: httpx.AsyncClient, sid: str, seed: int) -> None:
        options = {"search_url": search_url, "max_turns": searches + 1}
        opened = await h.post("/v1/sessions", json={"env": WEB_SEARCH_ENV, "session_id": sid, "seed": seed,
                                                    "options": options})  # fmt: skip
        if opened.status_code != 200:
            failures.append(f"{sid} open: {opened.status_code} {opened.text}")
            return
        for step in range(searches + 1):
            action = (
                f"<search>question {seed} part {step}</search>" if step < searches else "<answer>x</answer>"
            )
            r = await h.post(f"/v1/sessions/{sid}/step", json={"action": action, "step": step})
            if r.status_code != 200 or (step < searches and "a result for" not in r.json()["observation"]):
                failures.append(f"{sid} step {step}: {r.status_code} {r.text}")
                return
        await h.delete(f"/v1/sessions/{sid}")

    async def server(i: int, url: str) -> None:
        async with httpx.AsyncClient(base_url=url, timeout=timeout_s) as h:
            await asyncio.gather(*(trajectory(h, f"s{i}-{j}", i * per_server + j) for j in range(per_server)))

    await asyncio.gather(*(server(i, url) for i, url in enumerate(urls)))
    return failures
