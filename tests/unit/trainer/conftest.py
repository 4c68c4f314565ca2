"""The tiny Llama, generated once per session (no downloads; a few seconds of CPU)."""

from __future__ import annotations

import pathlib

import pytest
import torch

from treadle.trainer import policy


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    # One intra-op thread: two cores shared with other tests; more threads only contend.
    torch.set_num_threads(1)
    return policy.ensure_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)
