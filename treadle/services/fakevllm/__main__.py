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
    a = p.parse_args()
    eng = engine.SimulatedEngine(
        step_s=a.step_ms / 1000, step_per_seq_s=a.step_ms_per_seq / 1000, max_num_seqs=a.max_num_seqs,
        max_model_len=a.max_model_len, eos_probability=a.eos_probability,
    )  # fmt: skip
    serve.run(http_app.build_app(engine=eng), host=a.host, port=a.port)


if __name__ == "__main__":
    main()
