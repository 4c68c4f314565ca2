"""Weight sync driven by placement on real vLLM (CPU): the SDK's ``ClusterSwapper`` over placement's
``SwapWeights``, an inference agent registered with placement, the Treadle weights extension.

The tiny Llama again (``treadle.models.tiny``): version 1 zeroes every tensor, so every logprob is
exactly -ln(vocab); version 2 is damaged in the store (refused, v1 keeps serving, whole); version 3
restores the checkpoint and its logprobs exactly. Placement and the agent run in this process,
vLLM in its own.
"""

from __future__ import annotations

import asyncio
import json
import math
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from treadle.api import jobconfig
from treadle.client import swapper
from treadle.models import vllm_server
from treadle.services.agent import http_app as agent_app
from treadle.services.httputil import serve
from treadle.services.placement import client as placement_client
from treadle.services.placement import grpc_server, protocol, rebalance, service, weightsync
from treadle.testing import procs
from treadle.weights import objects, publish

PREFIX = "ns/sync"
PROMPT = "the calculator answer is"


@pytest.fixture(scope="module")
def vllm_url(model_dir: Path, weights_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = procs.free_port()
    argv = [
        sys.executable, "-m", "treadle.trainer.vllm_server", "--port", str(port), "--model", str(model_dir),
        "--weights-dir", str(weights_dir), "--weights-prefix", PREFIX,
        "--cache-dir", str(tmp_path_factory.mktemp("vllm-cache")), "--max-model-len", "256",
        "--max-num-seqs", "4",
    ]  # fmt: skip
    with procs.running("vllm", argv, lambda: vllm_server.healthy(port), timeout=600):
        yield f"http://127.0.0.1:{port}"


class Placement:
    def __init__(self, svc: service.PlacementService, sync: weightsync.WeightSync, address: str) -> None:
        self.svc = svc
        self.sync = sync
        self.address = address


@pytest.fixture
async def placement(vllm_url: str) -> AsyncIterator[Placement]:
    svc = service.PlacementService(
        pools={"pool": "decode-heavy"}, tasks={"math": jobconfig.TaskPlacement()},
        pool_agents={"pool": "policy"}, alpha=1,
    )  # fmt: skip
    sync = weightsync.WeightSync(
        svc, rebalance.HttpSwapper(apply_weights=True, timeout_s=120.0), apply_weights=True
    )
    served = await grpc_server.build_server(svc, sync=sync)
    address = f"127.0.0.1:{served.port}"
    agent_port = procs.free_port()
    app = agent_app.build_app(
        engine_url=vllm_url, worker_id="w0", poll_interval_s=0.2, placement=address, pool="pool",
        address=f"http://127.0.0.1:{agent_port}", agent="policy",
    )  # fmt: skip
    try:
        async with serve.running(app, port=agent_port):
            deadline = time.monotonic() + 60
            while not [w for w in svc.pool_state().workers if w.load.healthy]:
                assert time.monotonic() < deadline, "the agent did not register"
                await asyncio.sleep(0.1)
            yield Placement(svc, sync, address)
    finally:
        await served.stop(None)


async def logprobs(http: httpx.AsyncClient, url: str) -> list[float]:
    model = (await http.get(f"{url}/v1/models")).json()["data"][0]["id"]
    r = await http.post(
        f"{url}/v1/completions",
        json={"model": model, "prompt": PROMPT, "max_tokens": 8, "temperature": 0, "logprobs": 1},
    )
    r.raise_for_status()
    return list(r.json()["choices"][0]["logprobs"]["token_logprobs"])


async def status(http: httpx.AsyncClient, url: str) -> dict[str, object]:
    r = await http.post(f"{url}/collective_rpc", json={"method": "treadle_weights_status"})
    r.raise_for_status()
    return dict(r.json()["results"][0])


@pytest.mark.timeout(900)  # vLLM's start alone takes minutes on a busy 2-core box
async def test_placement_swaps_real_vllm_and_a_refused_version_leaves_the_previous_one_whole(
    placement: Placement, vllm_url: str, model_dir: Path, weights_dir: Path
) -> None:
    from safetensors import numpy as st_numpy

    vocab = int(json.loads((model_dir / "config.json").read_text())["vocab_size"])
    original = dict(st_numpy.load_file(str(model_dir / "model.safetensors")))
    store = objects.FileStore(weights_dir)
    pub = publish.Publisher(store, PREFIX, bucket_bytes=256 * 1024, staleness_window=4)
    client = placement_client.PlacementClient(placement.address)
    sync = swapper.ClusterSwapper(client, timeout_s=120.0)
    try:
        async with httpx.AsyncClient(timeout=120) as http:
            base = await logprobs(http, vllm_url)

            # v1 (all zeros): prefetched while generating, then swapped by placement: the pull was hidden.
            pub.publish({name: np.zeros_like(t) for name, t in original.items()}, 1)
            await sync.prefetch(1)
            deadline = time.monotonic() + 120
            while 1 not in (await status(http, vllm_url))["prefetched"]:  # type: ignore[operator]
                assert time.monotonic() < deadline, await status(http, vllm_url)
                await asyncio.sleep(0.2)
            await sync.swap(1)
            assert sync.last is not None
            (w0,) = sync.last.workers
            assert (w0.outcome, w0.pull) == ("swapped", "prefetched")
            assert await logprobs(http, vllm_url) == pytest.approx([-math.log(vocab)] * len(base), abs=1e-4)
            # Swapped again (say, retried after its agent restarted): the held version is not reloaded.
            again = await placement.sync.swap(protocol.SwapRequest(version=1, timeout_s=60))
            assert [(w.outcome, w.pull) for w in again.workers] == [("swapped", "held")]

            # v2: one bucket damaged in the store after publishing; refused, v1 keeps serving, whole.
            manifest = pub.publish(original, 2)
            damaged = store.root / manifest.buckets[len(manifest.buckets) // 2].key
            data = bytearray(damaged.read_bytes())
            data[len(data) // 2] ^= 0x40
            damaged.write_bytes(bytes(data))
            with pytest.raises(swapper.SwapIncomplete, match="digest"):
                await sync.swap(2)
            assert (await status(http, vllm_url))["loaded_version"] == 1
            assert await logprobs(http, vllm_url) == pytest.approx([-math.log(vocab)] * len(base), abs=1e-4)
            label = (await http.get(f"{vllm_url}/weight_info")).json()["weight_version"]
            assert label == "1"

            # v3: the checkpoint again; the original logprobs come back exactly.
            pub.publish(original, 3)
            await sync.swap(3)
            assert sync.last is not None and [w.outcome for w in sync.last.workers] == ["swapped"]
            assert await logprobs(http, vllm_url) == base
    finally:
        await client.aclose()
        store.close()
