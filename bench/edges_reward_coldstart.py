"""Reward gateway cold start: process start to the first scored request (the scale-from-zero cost).

Measured: ``python -m treadle.services.reward`` started fresh ``--trials`` times on 127.0.0.1. For each
trial: time to the first ``/healthz`` 200, then to the first ``math`` score answered, then the first
``code-tests`` score (which also starts the sandbox's first child). Polling every 5 ms, so figures
are within ~5 ms. This machine has 2 cores.

Run: ``python bench/edges_reward_coldstart.py``; results in ``--out`` (config.json, results.json).
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import benchcli
import httpx

from treadle.testing import procs


@dataclasses.dataclass
class Config:
    trials: int = dataclasses.field(default=5, metadata={"help": "fresh process starts"})
    seed: int = dataclasses.field(default=0, metadata={"help": "trajectory id prefix"})
    out: str = dataclasses.field(default="bench-out/edges_reward_coldstart", metadata={"help": "output dir"})


def trial(cfg: Config, i: int) -> dict[str, float]:
    port = procs.free_port()
    url = f"http://127.0.0.1:{port}"
    started = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "treadle.services.reward", "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        with httpx.Client(base_url=url, timeout=30) as h:
            while True:
                try:
                    if h.get("/healthz").status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if proc.poll() is not None or time.perf_counter() - started > 60:
                    raise RuntimeError("reward gateway did not start")
                time.sleep(0.005)
            healthy = time.perf_counter() - started
            body = {"trajectory_id": f"s{cfg.seed}-{i}", "reward_fn": "math",
                    "response": "<answer>4</answer>", "reference": "4"}  # fmt: skip
            assert h.post("/v1/score", json=body).json()["reward"] == 1.0
            scored = time.perf_counter() - started
            code = {"trajectory_id": f"s{cfg.seed}-{i}-code", "reward_fn": "code-tests",
                    "response": "```python\ndef f():\n    return 1\n```",
                    "reference": "assert f() == 1\n"}  # fmt: skip
            assert h.post("/v1/score", json=code).json()["reward"] == 1.0
            code_scored = time.perf_counter() - started
    finally:
        procs.stop(proc)
    return {"healthz_s": healthy, "first_math_score_s": scored, "first_code_score_s": code_scored}


def main() -> None:
    cfg = benchcli.parse(Config, __doc__)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(dataclasses.asdict(cfg), indent=2))
    runs = [trial(cfg, i) for i in range(cfg.trials)]
    summary = {
        k: {"median": statistics.median(r[k] for r in runs), "max": max(r[k] for r in runs)} for k in runs[0]
    }
    for key, s in summary.items():
        print(
            f"reward gateway cold start, process start -> {key[:-2]}: "
            f"median {s['median']:.3f} s, max {s['max']:.3f} s"
        )
    (out / "results.json").write_text(json.dumps({"trials": runs, "summary": summary}, indent=2))
    print(f"results: {out / 'results.json'}")


if __name__ == "__main__":
    main()
