"""Concurrent environment sessions in one env server process: open, step, close at scale.

Measured: a real ``python -m treadle.services.env`` process on 127.0.0.1. For each size, this process
opens that many ``math-tool`` sessions concurrently (``--connections`` pooled HTTP connections),
steps each once with a calculator call and once with its final answer, then closes them all.
Reported: wall time and requests/s per phase, step latency p50/p99, the server's resident memory with
all sessions open (VmRSS from /proc), and memory per session. This machine has 2 cores.

Warm pool: two more servers, from job files with ``spec.environment.warmPool`` 0 and N
(``--warm-pool``), each run ``--code-sessions``
``python-code`` sessions one after another: open, ``--code-gap-s`` idle (the model's first turn,
during which the pool refills), one attempt, close. Reported side by side: open and first-attempt
latency p50/p99. The attempt's figure is the whole sandboxed run: process start (what the pool
saves), the code, then killing and reaping the run's uid.

Run: ``python bench/edges_env_sessions.py``; results in ``--out`` (config.json, results.json).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

import benchcli
import httpx

from treadle.api import v1alpha1
from treadle.services import podenv
from treadle.services.httputil import client as http
from treadle.testing import procs


@dataclasses.dataclass
class Config:
    sizes: str = dataclasses.field(default="1000,5000", metadata={"help": "concurrent sessions, comma list"})
    connections: int = dataclasses.field(default=0, metadata={"help": "HTTP connection cap (0: none)"})
    seed: int = dataclasses.field(default=0, metadata={"help": "first task seed"})
    code_sessions: int = dataclasses.field(
        default=40, metadata={"help": "python-code sessions per pool size"}
    )
    warm_pool: int = dataclasses.field(default=4, metadata={"help": "warm pool of the second code server"})
    code_gap_s: float = dataclasses.field(default=0.2, metadata={"help": "idle between open and attempt"})
    out: str = dataclasses.field(default="bench-out/edges_env_sessions", metadata={"help": "output dir"})


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def sid(n: int, i: int) -> str:
    return f"n{n}-{i}"


def answer_for(observation: dict[str, Any]) -> str:
    return f"<answer>{observation['info']['reference']}</answer>"


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


TOOL_CALL = "<calculator>12*34</calculator>"


async def run(cfg: Config, url: str, pid: int, n: int) -> dict[str, Any]:
    h = http.new_client(url, timeout_s=300, max_connections=cfg.connections)
    try:
        idle = rss_mib(pid)

        async def timed(method: str, path: str, body: Any = None) -> tuple[float, Any]:
            started = time.perf_counter()
            result = await http.call(h, method, path, json=body)
            return time.perf_counter() - started, result

        phases: dict[str, float] = {}
        t = time.perf_counter()
        opened = await asyncio.gather(*(
            timed("POST", "/v1/sessions", {"env": "math-tool", "session_id": sid(n, i), "seed": cfg.seed + i})
            for i in range(n)
        ))  # fmt: skip
        phases["open"] = time.perf_counter() - t
        full = rss_mib(pid)
        t = time.perf_counter()
        tool = await asyncio.gather(*(
            timed("POST", f"/v1/sessions/{sid(n, i)}/step", {"action": TOOL_CALL, "step": 0})
            for i in range(n)
        ))  # fmt: skip
        answer = await asyncio.gather(*(
            timed("POST", f"/v1/sessions/{sid(n, i)}/step", {"action": answer_for(o), "step": 1})
            for i, (_, o) in enumerate(opened)
        ))  # fmt: skip
        phases["step"] = time.perf_counter() - t
        assert all(body["done"] for _, body in answer)
        t = time.perf_counter()
        await asyncio.gather(*(timed("DELETE", f"/v1/sessions/n{n}-{i}") for i in range(n)))
        phases["close"] = time.perf_counter() - t
        steps = [s for s, _ in tool + answer]
    finally:
        await h.aclose()
    return {
        "sessions": n, **{f"{k}_s": v for k, v in phases.items()},
        "requests_per_s": 4 * n / sum(phases.values()), "step_p50_ms": pct(steps, 0.5) * 1e3,
        "step_p99_ms": pct(steps, 0.99) * 1e3, "rss_idle_mib": idle, "rss_open_mib": full,
        "kib_per_session": (full - idle) * 1024 / n,
    }  # fmt: skip


ATTEMPT = "```python\ndef add(a, b):\n    return a + b\n```"


async def code_latency(cfg: Config, url: str) -> dict[str, Any]:
    h = http.new_client(url, timeout_s=60)
    opens, attempts = [], []
    try:
        for i in range(cfg.code_sessions):
            body = {"env": "python-code", "session_id": f"code-{i}", "seed": cfg.seed + i}
            t = time.perf_counter()
            await http.call(h, "POST", "/v1/sessions", json=body)
            opens.append(time.perf_counter() - t)
            await asyncio.sleep(cfg.code_gap_s)
            t = time.perf_counter()
            await http.call(h, "POST", f"/v1/sessions/code-{i}/step", json={"action": ATTEMPT, "step": 0})
            attempts.append(time.perf_counter() - t)
            await http.call(h, "DELETE", f"/v1/sessions/code-{i}")
    finally:
        await h.aclose()
    return {
        "open_p50_ms": pct(opens, 0.5) * 1e3, "open_p99_ms": pct(opens, 0.99) * 1e3,
        "attempt_p50_ms": pct(attempts, 0.5) * 1e3, "attempt_p99_ms": pct(attempts, 0.99) * 1e3,
    }  # fmt: skip


def healthy(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def code_job(warm_pool: int) -> v1alpha1.RolloutJob:
    """A python-code job keeping ``warm_pool`` sandbox processes warm (the env server reads only that)."""
    return v1alpha1.parse_job({
        "apiVersion": v1alpha1.API_VERSION, "kind": v1alpha1.KIND, "metadata": {"name": "env-sessions"},
        "spec": {
            "agents": [{"name": "default", "model": "none"}],
            "pools": [{"name": "p", "agent": "default", "accelerator": "H100"}],
            "tasks": [{"name": "code", "agents": ["default"], "environment": "python-code",
                       "reward": "code-tests"}],
            "environment": {"warmPool": warm_pool},
        },
    })  # fmt: skip


def main() -> None:
    cfg = benchcli.parse(Config, __doc__)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(dataclasses.asdict(cfg), indent=2))
    port = procs.free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [sys.executable, "-m", "treadle.services.env", "--port", str(port), "--max-sessions", "100000"]
    results = []
    with procs.running("env", argv, lambda: healthy(f"{url}/healthz"), timeout=60) as proc:
        for n in (int(x) for x in cfg.sizes.split(",")):
            r = asyncio.run(run(cfg, url, proc.pid, n))
            results.append(r)
            print(
                f"{n:>6} sessions: open {r['open_s']:.2f} s, 2 steps each {r['step_s']:.2f} s, "
                f"close {r['close_s']:.2f} s | {r['requests_per_s']:.0f} req/s | "
                f"step p50 {r['step_p50_ms']:.1f} ms p99 {r['step_p99_ms']:.1f} ms | "
                f"RSS {r['rss_idle_mib']:.0f} -> {r['rss_open_mib']:.0f} MiB "
                f"({r['kib_per_session']:.1f} KiB/session)"
            )
    warm: dict[int, dict[str, Any]] = {}
    for pool in (0, cfg.warm_pool):
        port = procs.free_port()
        code_url = f"http://127.0.0.1:{port}"
        argv = [sys.executable, "-m", "treadle.services.env", "--port", str(port)]
        job = podenv.job_env(code_job(pool), out / f"warm-pool-{pool}")
        with procs.running("env", argv, lambda: healthy(f"{code_url}/healthz"), env=job, timeout=60):  # noqa: B023
            time.sleep(1.0)  # the pool fills in the background after startup
            warm[pool] = asyncio.run(code_latency(cfg, code_url))
    print(
        f"python-code, {cfg.code_sessions} sessions one after another "
        f"(open, {cfg.code_gap_s} s idle, one attempt, close):"
    )
    for pool, r in warm.items():
        print(
            f"  warm pool {pool:>2}: open p50 {r['open_p50_ms']:.2f} ms p99 {r['open_p99_ms']:.2f} ms | "
            f"first attempt p50 {r['attempt_p50_ms']:.1f} ms p99 {r['attempt_p99_ms']:.1f} ms"
        )
    results.append({"python_code_by_warm_pool": warm})
    (out / "results.json").write_text(json.dumps(results, indent=2))
    print(f"results: {out / 'results.json'}")


if __name__ == "__main__":
    main()
