"""Benchmark: how long a DARTS early-stop abort takes to reach the engine (agent ABORT -> engine).

Measured on real processes, the engine SIMULATED: ``python -m treadle.services.fakevllm`` (every
request answers ``--tokens`` tokens at ``--step-ms`` per decode step, so it would run for seconds)
and ``python -m treadle.services.agent`` in front of it, as in a pod. For each background load
(requests kept running on the engine beside the one aborted), each repeat starts one more long
generation through the agent, waits until the engine runs it, then calls the agent's abort (the call
``scheduler.darts`` makes per surplus candidate) and times:

* ``ack``: the agent's ``/v1/abort`` answered (its generation task is cancelled);
* ``engine``: the engine's ``vllm:num_requests_running`` is back down (the request left its batch),
  polled on ``/metrics``: an upper bound by one scrape (``scrape`` is the median scrape time);
* ``caller``: the agent's ``generate`` call returned ``finish_reason=abort`` to its caller.

Run: ``python bench/darts_abort_latency.py [--repeats 50] [--loads 0,63] [--out DIR]``. This machine
has 2 cores shared by the processes and the other engineers: figures are upper bounds.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import benchcli
import httpx

from treadle import metrics
from treadle.services.agent import client as agent_client
from treadle.services.agent import protocol
from treadle.testing import procs


@dataclasses.dataclass(frozen=True)
class Config:
    repeats: int = dataclasses.field(default=50, metadata={"help": "aborts timed per load"})
    loads: str = dataclasses.field(default="0,63", metadata={"help": "requests running beside, comma list"})
    tokens: int = dataclasses.field(default=2000, metadata={"help": "tokens every request would generate"})
    step_ms: float = dataclasses.field(default=10.0, metadata={"help": "simulated time per decode step"})
    out: str = dataclasses.field(default="", metadata={"help": "directory for config.json, results.json"})


QUANTILES = (("p50", 0.5), ("p95", 0.95))


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def healthy(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1.0).status_code == 200
    except httpx.HTTPError:
        return False


async def running(http: httpx.AsyncClient, engine: str) -> int:
    for line in (await http.get(f"{engine}/metrics")).text.splitlines():
        if line.startswith(metrics.VLLM_NUM_REQUESTS_RUNNING + "{"):
            return int(float(line.rsplit(" ", 1)[1]))
    raise RuntimeError(f"{metrics.VLLM_NUM_REQUESTS_RUNNING} missing from the engine's /metrics")


async def until_running(http: httpx.AsyncClient, engine: str, n: int, *, timeout_s: float = 30.0) -> float:
    """Seconds until the engine runs ``n`` requests (polled)."""
    began = time.perf_counter()
    async with asyncio.timeout(timeout_s):
        while await running(http, engine) != n:  # noqa: ASYNC110 - the engine's count is only scraped
            await asyncio.sleep(0)
    return time.perf_counter() - began


def request(tid: str, cfg: Config) -> protocol.GenerateRequest:
    return protocol.GenerateRequest(
        trajectory_id=tid, turn=0, messages=[protocol.ChatMessage(role="user", content=f"long {tid}")],
        max_tokens=cfg.tokens, temperature=1.0,
    )  # fmt: skip


async def level(cfg: Config, engine: str, agent_url: str, load: int) -> dict[str, Any]:
    agent = agent_client.AgentClient(agent_url)
    async with httpx.AsyncClient(timeout=10) as http:
        background = [asyncio.create_task(agent.generate(request(f"bg{i}", cfg))) for i in range(load)]
        await until_running(http, engine, load)
        scrape = []
        for _ in range(20):
            began = time.perf_counter()
            await running(http, engine)
            scrape.append(time.perf_counter() - began)
        ack, seen, caller = [], [], []
        for r in range(cfg.repeats):
            tid = f"ab{load}-{r}"
            call = asyncio.create_task(agent.generate(request(tid, cfg)))
            await until_running(http, engine, load + 1)
            began = time.perf_counter()
            assert await agent.abort(tid), f"{tid} was not in flight on the agent"
            ack.append(time.perf_counter() - began)
            await until_running(http, engine, load)
            seen.append(time.perf_counter() - began)
            result = await call
            caller.append(time.perf_counter() - began)
            assert result.finish_reason == "abort", result.finish_reason
        for i in range(load):
            await agent.abort(f"bg{i}")
        await asyncio.gather(*background, return_exceptions=True)
    await agent.aclose()
    ms = 1000.0
    timed = {"ack": ack, "engine": seen, "caller": caller}
    return {
        "load": load, "repeats": cfg.repeats, "scrape_p50_ms": statistics.median(scrape) * ms,
        **{f"{name}_{q}_ms": pct(xs, p) * ms for name, xs in timed.items() for q, p in QUANTILES},
    }  # fmt: skip


def main() -> None:
    cfg = benchcli.parse(Config, __doc__)
    py = sys.executable
    eport, aport = procs.free_port(), procs.free_port()
    engine, agent = f"http://127.0.0.1:{eport}", f"http://127.0.0.1:{aport}"
    engine_argv = [py, "-m", "treadle.services.fakevllm", "--port", str(eport), "--step-ms", str(cfg.step_ms),
                   "--max-num-seqs", "1024", f"--tokens-for=.*={cfg.tokens}"]  # fmt: skip
    agent_argv = [py, "-m", "treadle.services.agent", "--port", str(aport), "--engine-url", engine]
    load_avg = os.getloadavg()[0]
    print(f"DARTS abort latency, agent -> SIMULATED engine; {os.cpu_count()} cores; load {load_avg:.2f}")
    results = []
    with contextlib.ExitStack() as stack:
        stack.enter_context(
            procs.running("fakevllm", engine_argv, lambda: healthy(f"{engine}/health"), timeout=60)
        )
        stack.enter_context(
            procs.running("agent", agent_argv, lambda: healthy(f"{agent}/healthz"), timeout=60)
        )
        for load in (int(x) for x in cfg.loads.split(",")):
            r = asyncio.run(level(cfg, engine, agent, load))
            results.append(r)
            cells = " | ".join(
                f"{name} p50 {r[f'{name}_p50_ms']:6.2f} ms p95 {r[f'{name}_p95_ms']:6.2f} ms"
                for name in ("ack", "engine", "caller")
            )
            print(f"beside {load:>4}: {cells} | scrape p50 {r['scrape_p50_ms']:.2f} ms")
    if cfg.out:
        out = Path(cfg.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(json.dumps(dataclasses.asdict(cfg), indent=2))
        (out / "results.json").write_text(json.dumps({"simulated_engine": True, "levels": results}, indent=2))


if __name__ == "__main__":
    main()
