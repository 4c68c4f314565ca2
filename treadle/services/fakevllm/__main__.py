"""``python -m treadle.services.fakevllm --host 127.0.0.1 --port N``: the SIMULATED vLLM engine."""

from __future__ import annotations

import argparse

from treadle.services.fakevllm import engine, http_app
from treadle.services.httputil import serve


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m treadle.services.fakevllm", description=__doc__)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--step-ms", type=float, default=0.0, help="simulated time per decode step (all requests)")
    p.add_argument("--step-ms-per-seq", type=float, default=0.0, help="added to a step per running request")
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--eos-probability", type=float, default=0.02, help="chance that each token is EOS")
    p.add_argument(
        "--prefill-us-per-token", type=float, default=0.0,
        help="a step takes this much longer per prompt token it prefills (0: prefill is free and immediate)",
    )  # fmt: skip
    p.add_argument(
        "--max-num-batched-tokens", type=int, default=8192,
        help="tokens one step processes at most, decode + prefill chunks (vLLM's flag)",
    )  # fmt: skip
    p.add_argument(
        "--prefix-cache-blocks", type=int, default=0,
        help=f"prefix cache capacity in blocks of {engine.BLOCK_SIZE} tokens, LRU (0: no prefix caching)",
    )  # fmt: skip
    p.add_argument(
        "--tokens-for", action="append", default=[], metavar="REGEX=N",
        help="tests: a chat request whose request_id matches REGEX generates exactly N tokens (repeatable)",
    )  # fmt: skip
    a = p.parse_args()
    tokens_for = [(pattern, int(n)) for pattern, _, n in (x.rpartition("=") for x in a.tokens_for)]
    eng = engine.SimulatedEngine(
        step_s=a.step_ms / 1000, step_per_seq_s=a.step_ms_per_seq / 1000, max_num_seqs=a.max_num_seqs,
        max_model_len=a.max_model_len, eos_probability=a.eos_probability,
        prefill_s_per_token=a.prefill_us_per_token / 1e6, max_num_batched_tokens=a.max_num_batched_tokens,
        prefix_cache_blocks=a.prefix_cache_blocks,
    )  # fmt: skip
    serve.run(http_app.build_app(engine=eng, tokens_for=tokens_for), host=a.host, port=a.port)


if __name__ == "__main__":
    main()
