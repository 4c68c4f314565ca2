"""The trainer's loop mechanics over the real services (processes on 127.0.0.1, SIMULATED ENGINE).

The simulated engine cannot load weights, so this tier checks the plumbing, never the learning
(that is ``tests/unit/trainer`` in-process, and ``make demo``'s ``treadle train`` on real vLLM in
``e2e/demo/test_demo.py``): versions advance one per step and reach the engines, every trained
sample respects the staleness bound, every output token carries a version no newer than the one
committed when its batch was requested, and every trajectory is accounted for (scheduler and buffer
books close).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from treadle.trainer import run

STEPS = 5
ALPHA = 1
# 49 s measured with a load of ~10 on 2 cores; the module's stack starts in the first test.
pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def summary(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    options = run.Options(engine="simulated", steps=STEPS, groups_per_step=2, group_size=4, max_tokens=8,
                          alpha=ALPHA)  # fmt: skip
    return asyncio.run(run.run(options, run_dir=tmp_path_factory.mktemp("train"), echo=print, timeout_s=600))


def test_one_version_per_step_reaches_every_engine(summary: dict[str, Any]) -> None:
    steps = summary["steps"]
    assert [s["published"] for s in steps] == list(range(1, STEPS + 1))
    # The batch of step k is requested before step k's fence, at the version committed by step k-1's.
    assert [s["version"] for s in steps] == [0, *range(0, STEPS - 1)]
    assert summary["committed"] == STEPS
    assert set(summary["served"].values()) == {STEPS}


def test_staleness_bound_and_token_versions(summary: dict[str, Any]) -> None:
    for s in summary["steps"]:
        assert s["staleness"] <= ALPHA, s
        oldest, newest = s["token_versions"]
        assert s["version"] - ALPHA <= oldest <= newest <= s["version"], s


def test_every_trajectory_is_accounted_for(summary: dict[str, Any]) -> None:
    buf = summary["buffer"]
    finished = summary["completed"] + summary["failed"] + summary["aborted"]
    assert summary["adds_up"]
    assert summary["submitted"] == summary["pending"] + summary["in_flight"] + finished
    # Every finished trajectory reached the buffer, and left it only by training or eviction.
    assert buf["put"] == finished
    assert buf["put"] == buf["delivered"] + buf["evicted"] + buf["stored"]
    assert buf["delivered"] == buf["acked"] == summary["trained"] == STEPS * 8
    assert summary["submitted"] == 4 * summary["groups_submitted"]
