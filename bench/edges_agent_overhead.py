"""Inference agent overhead against calling the engine directly, side by side in one run.

Measured, not simulated in the code path: the engine is the SIMULATED vLLM server
(``python -m treadle.services.fakevllm``, its own process) unless ``--engine-url`` points at a real
vLLM; the agent (``python -m treadle.services.agent``) runs in its own process beside it, as in a pod.
For each concurrency level this process keeps that many trajectories in flight, half of them calling
the engine's ``/v1/chat/completions`` directly (the same body the agent sends) and half calling the
agent's ``/v1/generate``, interleaved so both see the same load. Reported per path: turns, p50/p99
latency; the difference of medians; and the agent's own per-turn overhead (time inside the agent
outside the engine call) from its ``treadle_agent_overhead_seconds`` histogram (mean is exact, the
quantiles are bucket upper bounds). This machine has 2 cores shared by the three processes.

Run: ``python bench/edges_agent_overhead.py``; results in ``--out`` (config.json, results.json).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import benchcli
import httpx

from treadle.services.httputil import client as http
from treadle.testing import procs


@dataclasses.dataclass
class Config:
    concurrency: str = dataclasses.field(
        default="1,64,2000", metadata={"help": "in-flight trajectories, comma list"}
    )
    turns: int = dataclasses.field(
        default=4000, metadata={"help": "turns per path per concurrency level (cap)"}
    )
    duration_s: float = dataclasses.field(default=20.0, metadata={"help": "time cap per concurrency level"})
    max_tokens: int = dataclasses.field(default=16, metadata={"help": "output tokens per turn"})
    step_ms: float = dataclasses.field(
        default=20.0, metadata={"help": "simulated engine time per decode step"}
    )
    engine_url: str = dataclasses.field(
        default="", metadata={"help": "real vLLM URL (empty: simulated engine)"}
    )
    seed: int = dataclasses.field(default=0, metadata={"help": "prompt seed"})
    out: str = dataclasses.field(default="bench-out/edges_agent_overhead", metadata={"help": "output dir"})


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def healthy(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


async def level(cfg: Config, engine: str, agent: str, model: str, n: int) -> dict[str, Any]:
    lat: dict[str, list[float]] = {"direct": [], "agent": []}
    deadline = time.monotonic() + cfg.duration_s
    to_engine, to_agent = http.new_client(engine, timeout_s=300), http.new_client(agent, timeout_s=300)
    try:

        async def worker(i: int) -> None:
            path = "direct" if i % 2 == 0 else "agent"
            turn = 0
            while len(lat[path]) < cfg.turns and time.monotonic() < deadline:
                messages = [{"role": "user", "content": f"seed {cfg.seed} trajectory {i} turn {turn}"}]
                started = time.perf_counter()
                if path == "direct":
                    body = {"model": model, "messages": messages, "max_tokens": cfg.max_tokens,
                            "temperature": 1.0, "logprobs": True, "return_token_ids": True}  # fmt: skip
                    await http.call(to_engine, "POST", "/v1/chat/completions", json=body)
                else:
                    body = {"trajectory_id": f"b{n}-{i}", "turn": turn, "messages": messages,
                            "max_tokens": cfg.max_tokens}  # fmt: skip
                    await http.call(to_agent, "POST", "/v1/generate", json=body)
                lat[path].append(time.perf_counter() - started)
                turn += 1

        before = await overhead(to_agent)
        await asyncio.gather(*(worker(i) for i in range(max(n, 2))))
        after = await overhead(to_agent)
    finally:
        await to_engine.aclose()
        await to_agent.aclose()
    d, a = lat["direct"], lat["agent"]
    return {
        "in_flight": n, "direct_turns": len(d), "agent_turns": len(a),
        "direct_p50_ms": pct(d, 0.5) * 1e3, "direct_p99_ms": pct(d, 0.99) * 1e3,
        "agent_p50_ms": pct(a, 0.5) * 1e3, "agent_p99_ms": pct(a, 0.99) * 1e3,
        "delta_p50_ms": (pct(a, 0.5) - pct(d, 0.5)) * 1e3,
        **diff_overhead(before, after),
    }  # fmt: skip


async def overhead(to_agent: http.Client) -> dict[str, float]:
    """The agent's overhead histogram samples, keyed by name with labels."""
    text = await http.text(to_agent, "/metrics")
    samples = (
        line.rsplit(" ", 1) for line in text.splitlines() if line.startswith("treadle_agent_overhead_seconds")
    )
    return {key: float(value) for key, value in samples}


def diff_overhead(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    count = after.get("treadle_agent_overhead_seconds_count", 0) - before.get(
        "treadle_agent_overhead_seconds_count", 0
    )
    total = after.get("treadle_agent_overhead_seconds_sum", 0) - before.get(
        "treadle_agent_overhead_seconds_sum", 0
    )
    buckets = sorted(
        (float(k.split('le="')[1].split('"')[0]), after[k] - before.get(k, 0))
        for k in after
        if "_bucket{" in k and "+Inf" not in k
    )

    def bound(q: float) -> float:
        return next((le for le, c in buckets if c >= q * count), float("inf"))

    return {"agent_internal_mean_ms": total / count * 1e3 if count else float("nan"),
            "agent_internal_p50_le_ms": bound(0.5) * 1e3,
            "agent_internal_p99_le_ms": bound(0.99) * 1e3}  # fmt: skip


def main() -> None:
    cfg = benchcli.parse(Config, __doc__)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(dataclasses.asdict(cfg), indent=2))
    py = sys.executable
    simulated = not cfg.engine_url
    eport, aport = procs.free_port(), procs.free_port()
    engine = cfg.engine_url or f"http://127.0.0.1:{eport}"
    engine_argv = [py, "-m", "treadle.services.fakevllm", "--port", str(eport), "--step-ms", str(cfg.step_ms),
                   "--max-num-seqs", "8192", "--eos-probability", "0"]  # fmt: skip
    agent_argv = [py, "-m", "treadle.services.agent", "--port", str(aport), "--engine-url", engine]
    label = "SIMULATED engine (treadle.services.fakevllm)" if simulated else f"real vLLM at {engine}"
    print(
        f"agent overhead vs direct engine calls; {label}; {os.cpu_count()} cores; "
        f"{cfg.max_tokens} tokens/turn; load average {os.getloadavg()[0]:.2f} at start"
    )
    results = []
    with contextlib.ExitStack() as stack:
        if simulated:
            stack.enter_context(
                procs.running("fakevllm", engine_argv, lambda: healthy(f"{engine}/health"), timeout=60)
            )
        stack.enter_context(
            procs.running(
                "agent", agent_argv, lambda: healthy(f"http://127.0.0.1:{aport}/healthz"), timeout=60
            )
        )
        model = httpx.get(f"{engine}/v1/models").json()["data"][0]["id"]
        for n in (int(x) for x in cfg.concurrency.split(",")):
            r = asyncio.run(level(cfg, engine, f"http://127.0.0.1:{aport}", model, n))
            results.append(r)
            print(
                f"in-flight {n:>5}: direct p50 {r['direct_p50_ms']:8.2f} ms p99 {r['direct_p99_ms']:8.2f} ms "
                f"({r['direct_turns']} turns) | via agent p50 {r['agent_p50_ms']:8.2f} ms p99 "
                f"{r['agent_p99_ms']:8.2f} ms ({r['agent_turns']} turns) | "
                f"delta p50 {r['delta_p50_ms']:+7.2f} ms"
                f" | agent-internal mean {r['agent_internal_mean_ms']:.3f} ms, p50 <= "
                f"{r['agent_internal_p50_le_ms']:.2f} ms, p99 <= {r['agent_internal_p99_le_ms']:.2f} ms"
                f" | load {os.getloadavg()[0]:.2f}"
            )
    (out / "results.json").write_text(
        json.dumps({"simulated_engine": simulated, "levels": results}, indent=2)
    )
    print(f"results: {out / 'results.json'}")


if __name__ == "__main__":
    main()
