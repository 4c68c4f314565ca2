"""What the learn tests share: the repository's dev files, and the README's dev-cluster block's steps."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from treadle.devcluster import binaries
from treadle.operator.render import pool as render_pool

ROOT = Path(__file__).resolve().parents[2]
DEV = ROOT / "manifests" / "dev"
DATASETS = Path("/var/lib/treadle/datasets")
"""The host directory ``learn.yaml``'s feeder mounts (hostPath): process nodes' pods see the host."""
WEIGHTS = Path(render_pool.LOCAL_WEIGHTS_DIR)


SETUP = 5
"""The README's dev-cluster block up to the job: PATH, cluster up, helm install, dataset, model."""


def tool_env() -> dict[str, str]:
    """This session's environment with the tools on PATH, as the block's ``export PATH`` line puts them."""
    return os.environ | {"PATH": f"{Path(sys.executable).parent}:{binaries.bin_dir()}:{os.environ['PATH']}"}
