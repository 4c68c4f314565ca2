"""Start real vLLM (CPU) for the trainer's local stack, with the Treadle weights worker extension and
weight-transfer engine (``treadle.api.base.VLLM_WEIGHTS_ARGS``).

Run by ``treadle.trainer.run`` through ``treadle.localmode.stack.Stack`` as
``python -m treadle.trainer.vllm_server --host H --port P --model DIR --weights-dir W --weights-prefix X``
(``--weights-agent A``: a multi-agent job's engine, starting on agent A's versions).
It only sets the environment vLLM needs here (dev routes on, offline, a private compile cache, the
OpenMP runtime preloaded, the store the extension pulls from; anchors/weights_inference_deps.md B1)
and replaces itself with vLLM's OpenAI server, so a restart of the process restarts vLLM the same way.

``--enforce-eager``: it skips the torch.compile warm-up (healthy after 141 s instead of 168 s on
the loaded 2-core machine), and the hot swap (with the weights extension's LM-head re-pack) was
verified to reproduce the trainer's logprobs exactly in eager mode; the compiled mode
was not verified.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from treadle.api import base, env_vars


def argv_and_env(args: argparse.Namespace, environ: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """The vLLM command line and environment for ``args`` (pure, for tests)."""
    env = {
        **environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_SERVER_DEV_MODE": "1",
        "VLLM_NO_USAGE_STATS": "1", "VLLM_CPU_KVCACHE_SPACE": environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
        "VLLM_CACHE_ROOT": str(args.cache_dir), env_vars.WEIGHTS_DIR: str(args.weights_dir),
        env_vars.WEIGHTS_PREFIX: args.weights_prefix,
    }  # fmt: skip
    if args.weights_agent:
        env[env_vars.WEIGHTS_AGENT] = args.weights_agent
    iomp = Path(sys.executable).parent.parent / "lib" / "libiomp5.so"
    if iomp.exists():
        env["LD_PRELOAD"] = str(iomp)
    argv = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(args.model),
        "--host", args.host, "--port", str(args.port), "--dtype", "float32",
        "--max-model-len", str(args.max_model_len), "--max-num-seqs", str(args.max_num_seqs),
        *base.VLLM_WEIGHTS_ARGS, "--enforce-eager",
    ]  # fmt: skip
    return argv, env


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m treadle.trainer.vllm_server", description=__doc__)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--model", type=Path, required=True)
    p.add_argument("--weights-dir", type=Path, required=True, help="root of the local (file) weights store")
    p.add_argument("--weights-prefix", required=True)
    p.add_argument(
        "--weights-agent", default="", help="a multi-agent job's agent whose versions it starts on"
    )
    p.add_argument("--cache-dir", type=Path, required=True, help="vLLM compile cache (VLLM_CACHE_ROOT)")
    p.add_argument("--max-model-len", type=int, default=512)
    p.add_argument("--max-num-seqs", type=int, default=64)
    argv, env = argv_and_env(p.parse_args(), dict(os.environ))
    os.execve(argv[0], argv, env)


if __name__ == "__main__":
    main()
