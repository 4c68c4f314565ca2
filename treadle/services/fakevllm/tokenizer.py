"""Byte-level tokenizer of the simulated engine: ids 0-255 are bytes, then four special tokens.

Chat prompts use a ChatML template, as the tiny Llama of ``treadle.models`` does.
"""

from __future__ import annotations

from collections.abc import Sequence

BOS, EOS, IM_START, IM_END = 256, 257, 258, 259
SPECIALS = {BOS: "<|bos|>", EOS: "<|eos|>", IM_START: "<|im_start|>", IM_END: "<|im_end|>"}
VOCAB_SIZE = 260


def encode(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def decode(ids: Sequence[int]) -> str:
    return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


def token_str(token_id: int) -> str:
    return SPECIALS.get(token_id) or bytes([token_id]).decode("latin-1")


def apply_chat_template(messages: Sequence[tuple[str, str]]) -> list[int]:
    ids = [BOS]
    for role, content in messages:
        ids += [IM_START, *encode(f"{role}\n{content}"), IM_END, *encode("\n")]
    return [*ids, IM_START, *encode("assistant\n")]
