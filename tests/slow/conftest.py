"""Fixtures of the slow tier: the tiny Llama real vLLM serves, and a weight store beside it."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama with its tokenizer, generated locally (safetensors)."""
    pytest.importorskip("vllm")
    from treadle.models import tiny

    return tiny.generate(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture(scope="module")
def weights_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A local FileStore directory the trainer publishes to and the engine's extension reads."""
    return tmp_path_factory.mktemp("weights")
