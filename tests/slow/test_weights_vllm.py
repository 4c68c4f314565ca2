"""Real vLLM (CPU) with the Treadle worker extension: published versions change what it generates,
and a corrupt or missing version is never applied while the previous one keeps serving.

The model is the locally generated tiny Llama (``treadle.models.tiny``). Version 1 is the same
checkpoint with every tensor zeroed: logits are then uniform, so every sampled token's logprob is
exactly -ln(vocab) (anchors/weights_inference_deps.md B2), an unmistakable sign that it was
applied. Version 2 is damaged in the store, version 3 is never committed; version 4 restores the
original weights and must reproduce the original text and logprobs exactly.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from treadle.models import vllm_server
from treadle.testing import procs
from treadle.weights import layout, objects, publish

PREFIX = "slow/tiny"
PROMPT = "the calculator answer is"


@pytest.fixture(scope="module")
def vllm_url(model_dir: Path, weights_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = procs.free_port()
    venv = Path(sys.executable).parent.parent
    env = {
        "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_SERVER_DEV_MODE": "1", "VLLM_NO_USAGE_STATS": "1",
        "VLLM_CACHE_ROOT": str(tmp_path_factory.mktemp("vllm-cache")),
        "TREADLE_WEIGHTS_DIR": str(weights_dir), "TREADLE_WEIGHTS_PREFIX": PREFIX,
    }  # fmt: skip
    iomp = venv / "lib" / "libiomp5.so"
    if iomp.exists():
        env["LD_PRELOAD"] = str(iomp)
    argv = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
        "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32", "--max-model-len", "256",
        "--max-num-seqs", "8", "--worker-extension-cls", "treadle.weights.vllm_extension.WeightsExtension",
    ]  # fmt: skip
    with procs.running("vllm", argv, lambda: vllm_server.healthy(port), env=env, timeout=600):
        yield f"http://127.0.0.1:{port}"


def _complete(url: str) -> tuple[str, list[float]]:
    r = httpx.post(
        f"{url}/v1/completions",
        json={"model": _model(url), "prompt": PROMPT, "max_tokens": 12, "temperature": 0, "logprobs": 1},
        timeout=60,
    )
    r.raise_for_status()
    choice = r.json()["choices"][0]
    return choice["text"], choice["logprobs"]["token_logprobs"]


def _model(url: str) -> str:
    return str(httpx.get(f"{url}/v1/models", timeout=10).json()["data"][0]["id"])


def _rpc(url: str, method: str, *args: str) -> httpx.Response:
    return httpx.post(f"{url}/collective_rpc", json={"method": method, "args": list(args)}, timeout=120)


def _status(url: str) -> dict[str, Any]:
    r = _rpc(url, "treadle_weights_status")
    r.raise_for_status()
    status: dict[str, Any] = r.json()["results"][0]
    return status


def _update(url: str, version: int) -> httpx.Response:
    """Suspend, apply, drop KV computed with the old weights, resume: the agent's sequence."""
    assert httpx.post(f"{url}/pause", params={"mode": "keep"}, timeout=60).status_code == 200
    try:
        applied = _rpc(url, "treadle_weights_apply", str(version))
        assert httpx.post(f"{url}/reset_prefix_cache", timeout=60).status_code == 200
    finally:
        assert httpx.post(f"{url}/resume", timeout=60).status_code == 200
    return applied


def _checkpoint(model_dir: Path) -> dict[str, np.ndarray]:
    from safetensors import numpy as st_numpy

    return dict(st_numpy.load_file(str(model_dir / "model.safetensors")))


@pytest.mark.timeout(900)  # vLLM's start (torch.compile warm-up) alone takes minutes on a busy 2-core box
def test_published_versions_change_generation_and_bad_ones_never_apply(
    vllm_url: str, model_dir: Path, weights_dir: Path
) -> None:
    vocab = int(json.loads((model_dir / "config.json").read_text())["vocab_size"])
    uniform = -math.log(vocab)
    original = _checkpoint(model_dir)
    store = objects.FileStore(weights_dir)
    pub = publish.Publisher(store, PREFIX, bucket_bytes=256 * 1024, staleness_window=4)
    base_text, base_lps = _complete(vllm_url)
    assert _status(vllm_url)["loaded_version"] == 0
    assert not all(lp == pytest.approx(uniform, abs=1e-4) for lp in base_lps)

    # v1: all zeros. Prefetched while the engine keeps generating, applied under pause.
    pub.publish({name: np.zeros_like(t) for name, t in original.items()}, 1)
    assert _rpc(vllm_url, "treadle_weights_prefetch", "1").status_code == 200
    assert _complete(vllm_url) == (base_text, base_lps)  # still v0 while prefetching
    applied = _update(vllm_url, 1)
    assert applied.status_code == 200, applied.text
    assert applied.json()["results"][0]["loaded_version"] == 1
    v1_text, v1_lps = _complete(vllm_url)
    assert v1_text != base_text
    assert v1_lps == pytest.approx([uniform] * len(v1_lps), abs=1e-4)

    # v2: the original weights, but one bucket damaged in the store after publishing.
    manifest = pub.publish(original, 2)
    damaged = store.root / manifest.buckets[len(manifest.buckets) // 2].key
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0x40
    damaged.write_bytes(bytes(data))
    assert _rpc(vllm_url, "treadle_weights_prefetch", "2").status_code == 200
    refused = _update(vllm_url, 2)
    assert refused.status_code >= 400
    status = _status(vllm_url)
    assert status["loaded_version"] == 1 and status["healthy"]
    assert "v2 refused" in status["last_error"] and "digest" in status["last_error"]
    assert _complete(vllm_url) == (v1_text, v1_lps)  # v1 keeps serving

    # v3 never committed: its buckets exist, the manifest does not.
    store.put(layout.bucket_key(PREFIX, 3, 0), b"\x00" * 64)
    assert _update(vllm_url, 3).status_code >= 400
    assert _status(vllm_url)["loaded_version"] == 1
    assert _complete(vllm_url) == (v1_text, v1_lps)

    # v4: the original weights intact; the original generation comes back exactly.
    store.remove_dir(layout.version_dir(PREFIX, 3))
    pub.publish(original, 4)
    restored = _update(vllm_url, 4)
    assert restored.status_code == 200, restored.text
    assert _status(vllm_url)["loaded_version"] == 4
    assert _complete(vllm_url) == (base_text, base_lps)
