"""``make demo``, as the README's quickstart block gives it, on this machine: its three parts run and
say what they should (the job trains to step 20 on the dev cluster and leaves no child behind; the
local rollout; the learning loop). The block's other command, ``make test``, is what CI runs
(``.ci/run``)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from treadle.testing import docblocks

ROOT = Path(__file__).resolve().parents[2]


DEMO_TIMEOUT_S = 2400
"""What ``make demo`` may take here (the dev cluster up, the job's 20 steps, both local parts)."""


@pytest.mark.timeout(DEMO_TIMEOUT_S + 120)  # the suite's default (300 s) cut the demo short at load
def test_make_demo_runs_its_three_parts() -> None:
    b = docblocks.block(ROOT, "quickstart")
    demo, test = b.commands()
    assert (demo, test) == ("make demo", "make test") and "make test" in (ROOT / ".ci" / "run").read_text()
    demo_only = docblocks.Block(b.path, b.line, b.lang, b.kind, b.ident, demo)
    (ran,) = docblocks.run(demo_only, env=os.environ, cwd=ROOT, timeout_s=DEMO_TIMEOUT_S)
    out = ran.output
    steps = re.findall(r"^step\s+\d+", out, flags=re.M)
    assert len(steps) >= 20, out[-4000:]  # the trainer pod's log: one line per step
    assert "children left after deleting the job: 0" in out, out[-4000:]
    assert "== 2/3 Local rollout" in out and "== 3/3 Learning loop" in out, out[-4000:]
