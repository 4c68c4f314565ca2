"""The docs' blocks marked ``<!-- doc-test: run -->`` run as written, with the virtualenv's tools on
PATH as the README's ``export PATH`` line puts them (``treadle.testing.docblocks``)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from treadle.testing import docblocks

ROOT = Path(__file__).resolve().parents[3]
RUN = [b for b in docblocks.blocks(ROOT) if b.kind == "run"]


@pytest.mark.parametrize("block", RUN, ids=[b.where for b in RUN])
def test_the_block_runs(block: docblocks.Block) -> None:
    env = os.environ | {"PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    ran = docblocks.run(block, env=env, cwd=ROOT, timeout_s=600)
    assert len(ran) == len(block.commands())
