"""Heddle's policies on the real services (every one a process on 127.0.0.1, simulated engine).

Runs ``bench/heddle_live.py`` small: the baseline (sticky least-loaded + FIFO) and Heddle
(heddle placement + heddle scheduling) on the same long-tailed workload, one after the other.
Asserts only what must hold whatever the machine's load: every trajectory of both completes, the
migrations and preemptions are counted, ranks are exposed, the engines' prefix caches (``--prefill``)
hit on later turns, and the SIMULATED tool latency (``--tool-s``, the user environment
``bench/heddle_tools.py`` that the env server imports) is on every trajectory's path. Speed is the
benchmark's business.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
TOOL_S = 0.2
LONGEST = 12
GROUPS = 21


def test_heddle_policies_complete_every_trajectory_and_expose_ranks(tmp_path: Path) -> None:
    out = tmp_path / "bench"
    argv = [
        sys.executable, str(ROOT / "bench" / "heddle_live.py"), "--out", str(out),
        # --mix: one group of 12 turns among twenty of 2 (21 groups), the critical-path regime's shape;
        # a gate wider than the batch, so the fallback's fluid model keeps the DP's plan (the long pair
        # apart from the many short) and its migrations run; a narrow gate can make the step fall back
        # to sticky least-loaded instead (tests/unit/policy/heddle/test_heddle_fallback.py)
        "--configs", "baseline,heddle", "--mix", f"1x{LONGEST},{GROUPS - 1}x2", "--group-size", "2",
        "--max-turns", str(LONGEST), "--tokens", "8", "--steps", "2", "--gate", "64",
        "--step-timeout-s", "120", "--prefill", "--tool-s", str(TOOL_S),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=400, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    runs = {name: rounds[0] for name, rounds in results["configs"].items()}
    assert set(runs) == {"baseline", "heddle"}
    for name, run in runs.items():
        assert (run["completed"], run["failed"], run["aborted"]) == (2 * GROUPS * 2, 0, 0), name
        assert len(run["step_s"]) == 2
        # the 12-turn trajectories wait out 11 tool calls of TOOL_S each (without the wait: about 0.5 s)
        assert min(run["step_s"]) >= (LONGEST - 1) * TOOL_S, run["step_s"]
        # one probe summary per step: load sampled on both workers, every trajectory's finish seen
        assert [set(p["load_mean"]) for p in run["probes"]] == [{"w0", "w1"}] * 2, name
        assert all(
            p["last_s"] is not None and set(p["done_at_s"]) == {"50", "90", "99"} for p in run["probes"]
        )
        # --prefill: a later turn on the same engine finds its conversation so far in the prefix cache
        # (the chat template re-renders it byte for byte); caches are reset before every step
        assert [0 < c["hits"] < c["queries"] for c in run["prefix_cache"]] == [True, True], name
    heddle = runs["heddle"]
    assert (heddle["placement"], heddle["scheduling"]) == ("heddle", "heddle")
    assert heddle["migrations"] > 0  # long trajectories move off the crowded worker at their tool calls
    assert heddle["preemptions"] >= 0 and runs["baseline"]["preemptions"] == 0
    assert runs["baseline"]["migrations"] == 0
    listed = heddle["top_ranked_at_submit"]
    assert [t["rank"] for t in listed] == list(range(len(listed))) and listed
    assert all(t["worker"] in {"", "w0", "w1"} and t["predicted_remaining"] >= 0 for t in listed)
