"""``make demo``, as the README's quickstart block gives it, on this machine: its three parts run and
say what they should. The block's other command, ``make test``, is what CI runs (``.ci/run``).

1. The dev cluster: ``manifests/dev/learn.yaml`` trains to step 20 with its two trainer pods (ranks 0
   and 1 of one FSDP2 group), STEP and POLICY only climb, the policy learns (the mean reward of the
   last three steps at least twice the first step's), the scheduler's counts reach ``treadle
   status``, and deleting the job leaves no child behind. (``e2e/learn`` runs the README's own
   dev-cluster block, and variants of the job with faults.)
2. The local rollout runs.
3. ``treadle train`` learns on real vLLM (CPU): rollout, reward, buffer, GRPO step, publication and
   hot swap, 20 steps of 4 groups x 8 answers, alpha 1, on the toy task (reward: fraction of ``a``
   characters). The engine generates with the weights the trainer publishes (worker extension,
   applied under suspend), so the mean reward only rises if every stage works. Measured on the
   2-core machine, seed 0, two runs: step 1 -> 20 mean reward 0.016 -> 0.136 and 0.016 -> 0.157
   (about 6-7x from the first three steps to the last three); the threshold (twice) leaves a wide
   margin. Its ``summary.json`` says what was committed, served and how stale.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from treadle.testing import docblocks

ROOT = Path(__file__).resolve().parents[2]


DEMO_TIMEOUT_S = 2400
"""What ``make demo`` may take here (the dev cluster up, the job's 20 steps, both local parts)."""
ROW = re.compile(r"^\s*learn\s+\S+\s+\S+\s+(\d+)\s+(\d+)\b", re.MULTILINE)
"""A ``kubectl get rolloutjobs`` row of ``learn`` as the demo prints it: POLICY, STEP."""
STEP_LINE = re.compile(r"^step\s+(\d+)\s+v(\d+)\s+mean reward\s+([0-9.]+)", re.MULTILINE)
"""A line of the trainer pod's log."""


@pytest.mark.timeout(DEMO_TIMEOUT_S + 120)  # the suite's default (300 s) cut the demo short at load
def test_make_demo_runs_its_three_parts() -> None:
    b = docblocks.block(ROOT, "quickstart")
    demo, test = b.commands()
    assert (demo, test) == ("make demo", "make test") and "make test" in (ROOT / ".ci" / "run").read_text()
    demo_only = docblocks.Block(b.path, b.line, b.lang, b.kind, b.ident, demo)
    (ran,) = docblocks.run(demo_only, env=os.environ, cwd=ROOT, timeout_s=DEMO_TIMEOUT_S)
    out = ran.output
    assert "== 2/3 Local rollout" in out and "== 3/3 Learning loop" in out, out[-4000:]
    cluster, rest = out.split("== 2/3 Local rollout", 1)
    _, learning = rest.split("== 3/3 Learning loop", 1)

    seen = [(int(step), int(policy)) for policy, step in ROW.findall(cluster)]
    steps, policies = [s for s, _ in seen], [p for _, p in seen]
    assert steps == sorted(steps) and policies == sorted(policies), seen
    assert len(set(steps)) >= 5 and steps[-1] == 20 and policies[-1] >= 20, seen
    rewards = [float(m.group(3)) for m in STEP_LINE.finditer(cluster)]
    assert len(rewards) >= 20, cluster[-4000:]  # the trainer pod's log: one line per step
    assert sum(rewards[-3:]) / 3 >= 2 * rewards[0], rewards
    # The pod listing's RANK column: the trainer's Indexed Job has two pods, ranks 0 and 1.
    ranks = re.findall(r"^learn-trainer-\S+\s+\S+\s+\S+\s+(\d+)\s*$", cluster, flags=re.MULTILINE)
    trainers = sorted(set(ranks))
    assert trainers == ["0", "1"], cluster[cluster.find("POD ") :][:3000]
    completed = re.search(r"^\s+(\d+) completed, ", cluster, flags=re.MULTILINE)
    assert completed and int(completed[1]) >= 20 * 4 * 8 // 2, cluster[-4000:]  # most were stored
    assert "trajectories/min" in cluster, cluster[-4000:]
    assert "children left after deleting the job: 0" in cluster, cluster[-4000:]

    where = re.search(r"summary in (\S+)/summary\.json", learning)
    assert where, learning[-4000:]
    summary = json.loads((Path(where[1]) / "summary.json").read_text())
    rewards = [s["mean_reward"] for s in summary["steps"]]
    first, last = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    assert len(rewards) == 20 and last >= 2 * first, rewards
    assert summary["engine"] == "vllm" and summary["committed"] == 20, summary
    assert set(summary["served"].values()) == {20}, summary["served"]
    assert summary["staleness_max"] <= 1 and summary["adds_up"], summary
