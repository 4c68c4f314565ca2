"""The generated test model as a Qwen3: its config class and tensors, the architecture recorded, the
Llama's tokenizer, and an unknown architecture refused before anything is written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from treadle.models import tiny


def test_a_qwen3_has_q_and_k_norms_the_llamas_tokenizer_and_records_its_arch(tmp_path: Path) -> None:
    import transformers
    from safetensors import safe_open

    llama = tiny.generate(tmp_path / "llama", seed=0)
    qwen = tiny.generate(tmp_path / "qwen3", seed=0, arch="qwen3")
    config = json.loads((qwen / "config.json").read_text())
    assert (config["model_type"], config["architectures"]) == ("qwen3", ["Qwen3ForCausalLM"])
    assert (config["head_dim"], config["num_key_value_heads"], config["tie_word_embeddings"]) == (64, 1, True)
    assert json.loads((qwen / "treadle-model.json").read_text())["arch"] == "qwen3"
    assert json.loads((llama / "treadle-model.json").read_text())["arch"] == "llama"
    assert isinstance(transformers.AutoConfig.from_pretrained(str(qwen)), transformers.Qwen3Config)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (qwen / name).read_bytes() == (llama / name).read_bytes(), name
    with safe_open(str(qwen / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    assert {f"model.layers.{i}.self_attn.{n}_norm.weight" for i in (0, 1) for n in "qk"} <= names
    assert "lm_head.weight" not in names  # tied, as the Llama's: vLLM's loader skips it either way
    with safe_open(str(llama / "model.safetensors"), "pt") as f:
        assert not [n for n in f.keys() if "q_norm" in n or "k_norm" in n]  # noqa: SIM118


def test_an_unknown_arch_is_refused_naming_the_parameter(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="arch: expected one of llama, qwen3, got 'gemma'"):
        tiny.generate(tmp_path / "m", arch="gemma")
    assert not (tmp_path / "m").exists()  # refused before anything was written
