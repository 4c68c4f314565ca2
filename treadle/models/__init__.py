"""Tiny models generated locally (no hub): the random Llama + byte-level BPE tokenizer for real vLLM."""
