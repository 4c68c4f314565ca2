"""A worker moved between agents serves the receiver's weights: real vLLM (CPU), the weights extension,
the inference agent, placement's ``HttpSwapper(apply_weights=True)`` and the trainer's ``EngineSwapper``.

One engine (the locally generated tiny Llama) of a two-agent job, started on the planner's versions
(``<job>/planner``). The planner's trainer swaps in its version 1 (the checkpoint with the final
norm halved), whose logprobs for a fixed prompt are the reference. Placement then moves the worker
to the executor, whose version 1 is all zeros (uniform logits: every logprob is exactly -ln(vocab)),
and back to the planner: the planner's logprobs come back exactly. Last, a move to an agent with no
trained version yet (version 0) gives back the checkpoint's logprobs. Only the move's swap step is
driven here; drain and re-home are covered with the simulated engine in the integration tests.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from treadle.models import vllm_server
from treadle.services.agent import client as agent_client
from treadle.services.agent import http_app as agent_app
from treadle.services.httputil import serve
from treadle.services.placement import rebalance
from treadle.testing import procs
from treadle.trainer import engines
from treadle.v1 import placement_pb2
from treadle.weights import layout, objects, publish

JOB = "ns/marl"
PROMPT = "the calculator answer is"


@pytest.fixture(scope="module")
def vllm_url(model_dir: Path, weights_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = procs.free_port()
    argv = [
        sys.executable, "-m", "treadle.trainer.vllm_server", "--port", str(port), "--model", str(model_dir),
        "--weights-dir", str(weights_dir), "--weights-prefix", JOB, "--weights-agent", "planner",
        "--cache-dir", str(tmp_path_factory.mktemp("vllm-cache")), "--max-model-len", "256",
        "--max-num-seqs", "4",
    ]  # fmt: skip
    with procs.running("vllm", argv, lambda: vllm_server.healthy(port), timeout=600):
        yield f"http://127.0.0.1:{port}"


@pytest.fixture
async def agent_url(vllm_url: str) -> AsyncIterator[str]:
    async with serve.running(agent_app.build_app(engine_url=vllm_url, worker_id="w0")) as url:
        yield url


async def logprobs(http: httpx.AsyncClient, url: str) -> list[float]:
    model = (await http.get(f"{url}/v1/models")).json()["data"][0]["id"]
    r = await http.post(
        f"{url}/v1/completions",
        json={"model": model, "prompt": PROMPT, "max_tokens": 8, "temperature": 0, "logprobs": 1},
    )
    r.raise_for_status()
    return [float(lp) for lp in r.json()["choices"][0]["logprobs"]["token_logprobs"]]


async def served(http: httpx.AsyncClient, url: str) -> tuple[str, int, str]:
    """(prefix, loaded version) the extension reports, and the engine's label."""
    r = await http.post(f"{url}/collective_rpc", json={"method": "treadle_weights_status", "args": []})
    r.raise_for_status()
    status = r.json()["results"][0]
    label = (await http.get(f"{url}/weight_info")).json()["weight_version"]
    return status["prefix"], status["loaded_version"], label


def publish_as(store: objects.ObjectStore, agent: str, version: int, state: dict[str, np.ndarray]) -> None:
    pub = publish.Publisher(
        store, layout.agent_prefix(JOB, agent), bucket_bytes=256 * 1024, staleness_window=4
    )
    pub.publish(state, version)


@pytest.mark.timeout(900)  # vLLM's start alone takes a minute or more on a busy 2-core machine
async def test_a_moved_engine_serves_the_receivers_weights(
    vllm_url: str, agent_url: str, model_dir: Path, weights_dir: Path
) -> None:
    from safetensors import numpy as st_numpy

    original = dict(st_numpy.load_file(str(model_dir / "model.safetensors")))
    uniform = -math.log(int(json.loads((model_dir / "config.json").read_text())["vocab_size"]))
    store = objects.FileStore(weights_dir)
    planner = {**original, "model.norm.weight": original["model.norm.weight"] * 0.5}
    publish_as(store, "planner", 1, planner)
    publish_as(store, "executor", 1, {name: np.zeros_like(t) for name, t in original.items()})
    worker = placement_pb2.Worker(worker_id="w0", pool="exec", address=agent_url, engine_address=vllm_url)
    mover = rebalance.HttpSwapper(apply_weights=True, timeout_s=120.0)

    async with httpx.AsyncClient(timeout=120) as http:
        checkpoint = await logprobs(http, vllm_url)
        # The planner's trainer: its version 1, from the planner's prefix the engine started on.
        trainer = engines.EngineSwapper(
            [engines.Replica("w0", vllm_url, agent_url)], extension=True, agent="planner"
        )
        await trainer.swap(1)
        planner_lps = await logprobs(http, vllm_url)
        assert planner_lps != pytest.approx(checkpoint, abs=1e-3)
        assert await served(http, vllm_url) == (f"{JOB}/planner", 1, "1")

        # Moved to the executor: its weights (uniform logits), not the planner's.
        await mover.swap(worker, agent="executor", version=1)
        executor_lps = await logprobs(http, vllm_url)
        assert executor_lps == pytest.approx([uniform] * len(executor_lps), abs=1e-4)
        assert await served(http, vllm_url) == (f"{JOB}/executor", 1, agent_client.label("executor", 1))

        # Moved back to the planner: exactly the planner's logprobs again, not the donor's.
        worker.pool = "plan"
        await mover.swap(worker, agent="planner", version=1)
        assert await logprobs(http, vllm_url) == planner_lps
        assert await served(http, vllm_url) == (f"{JOB}/planner", 1, agent_client.label("planner", 1))

        # An agent not trained yet serves the checkpoint (its version 0), reloaded from the model files.
        await mover.swap(worker, agent="critic", version=0)
        assert await logprobs(http, vllm_url) == checkpoint
        assert await served(http, vllm_url) == (f"{JOB}/critic", 0, agent_client.label("critic", 0))
