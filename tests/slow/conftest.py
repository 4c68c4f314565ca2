"""Fixtures of the slow tier: the tiny Llama real vLLM serves, a weight store beside it, and one
plain vLLM serving it that the modules needing nothing else share (each sets the weight version it
expects first)."""

from __future__ import annotations

from collections.abc import Iterator
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


@pytest.fixture(scope="package")
def tiny_vllm_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Real vLLM (CPU) serving the tiny Llama of seed 0 with ``vllm_server``'s defaults: started once
    for the modules that need no other model, engine flag or weight store (40-130 s a start)."""
    pytest.importorskip("vllm")
    from treadle.models import tiny, vllm_server

    root = tmp_path_factory.mktemp("vllm")
    model = tiny.generate(root / "tiny-llama", seed=0)
    with vllm_server.running(model, cache_dir=root / "cache") as (url, _):
        yield url
