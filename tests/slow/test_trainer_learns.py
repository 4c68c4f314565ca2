"""The whole loop learns on real vLLM (CPU): rollout, reward, buffer, GRPO step, publication, hot swap.

``treadle train`` with default settings (20 steps of 4 groups x 8 answers, alpha 1) on the toy task
(reward: fraction of 'a' characters). The engine generates with the weights the trainer publishes
(worker extension, applied under suspend), so the mean reward only rises if every stage works.
Measured on the 2-core machine, seed 0, two runs: step 1 -> 20 mean reward 0.016 -> 0.136 and
0.016 -> 0.157 (mean of the first three steps 0.022 / 0.021, of the last three 0.130 / 0.148, about
6-7x); seed 1 (other prompts): 0.016 -> 0.148. The threshold (last three at least twice the
first three) leaves a wide margin.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from treadle.trainer import run


# Minutes on a loaded 2-core machine: vLLM start, 20 steps, shutdown (3m47s measured with a load of ~10).
@pytest.mark.timeout(1800)
def test_mean_reward_rises_clearly_over_20_steps(tmp_path: Path) -> None:
    pytest.importorskip("vllm")
    summary = asyncio.run(
        run.run(run.Options(engine="vllm", steps=20, seed=0), run_dir=tmp_path, timeout_s=1500)
    )
    rewards = [s["mean_reward"] for s in summary["steps"]]
    first, last = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    assert last >= 2 * first, rewards
    assert summary["committed"] == 20 and set(summary["served"].values()) == {20}
    assert summary["staleness_max"] <= 1 and summary["adds_up"]
