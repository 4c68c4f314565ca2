"""The generated test model: its size knobs, and a context that leaves the weights as they were."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from treadle.models import tiny


def test_a_longer_context_keeps_the_weights_of_the_default_model(tmp_path: Path) -> None:
    default = tiny.generate(tmp_path / "default", seed=0)
    longer = tiny.generate(tmp_path / "longer", seed=0, context=4096)
    assert json.loads((longer / "config.json").read_text())["max_position_embeddings"] == 4096
    weights = "model.safetensors"
    assert (default / weights).read_bytes() == (longer / weights).read_bytes()


def test_width_and_depth_size_the_model(tmp_path: Path) -> None:
    config = json.loads((tiny.generate(tmp_path / "m", hidden=192, layers=3) / "config.json").read_text())
    assert (config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]) == (192, 384, 3)
    assert config["num_attention_heads"] * config["head_dim"] == 192


@pytest.mark.parametrize("hidden", [0, 100])
def test_a_width_that_is_not_whole_heads_is_refused(tmp_path: Path, hidden: int) -> None:
    with pytest.raises(ValueError, match="hidden: expected a positive multiple of 64"):
        tiny.generate(tmp_path / "m", hidden=hidden)


@pytest.mark.parametrize(
    ("size", "message"),
    [({"layers": 0}, "layers: expected at least 1"), ({"context": 0}, "context: expected a positive number")],
)
def test_no_layers_or_no_context_is_refused(tmp_path: Path, size: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        tiny.generate(tmp_path / "m", **size)
