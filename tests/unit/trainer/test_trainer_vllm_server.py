"""The vLLM command line the trainer's stack runs: dev routes, the extension and its weight-transfer
engine, eager mode, the store."""

from __future__ import annotations

import argparse
from pathlib import Path

from treadle.trainer import vllm_server


def test_argv_and_env() -> None:
    args = argparse.Namespace(
        host="127.0.0.1", port=8123, model=Path("/m"), weights_dir=Path("/w"), weights_prefix="local/x",
        cache_dir=Path("/c"), max_model_len=512, max_num_seqs=16, weights_agent="",
    )  # fmt: skip
    argv, env = vllm_server.argv_and_env(args, {"PATH": "/bin", "VLLM_CPU_KVCACHE_SPACE": "4"})
    assert argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    joined = " ".join(argv)
    assert "--model /m --host 127.0.0.1 --port 8123" in joined and "--enforce-eager" in argv
    assert argv[argv.index("--worker-extension-cls") + 1] == "treadle.weights.vllm_extension.WeightsExtension"
    assert argv[argv.index("--weight-transfer-config") + 1] == '{"backend":"treadle"}'
    assert env["VLLM_SERVER_DEV_MODE"] == "1" and env["PATH"] == "/bin"
    assert (env["TREADLE_WEIGHTS_DIR"], env["TREADLE_WEIGHTS_PREFIX"]) == ("/w", "local/x")
    assert env["VLLM_CACHE_ROOT"] == "/c" and env["VLLM_CPU_KVCACHE_SPACE"] == "4"
    assert "TREADLE_WEIGHTS_AGENT" not in env
    args.weights_agent = "planner"  # a multi-agent job's engine starts on its agent's versions
    assert vllm_server.argv_and_env(args, {})[1]["TREADLE_WEIGHTS_AGENT"] == "planner"
