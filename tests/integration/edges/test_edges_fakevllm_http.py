"""The simulated vLLM server over HTTP, validated with the ``openai`` SDK's own response types."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import httpx
import openai
import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletion

from treadle import metrics
from treadle.services.fakevllm import engine

WaitUntil = Callable[[Callable[[], bool]], Awaitable[None]]


async def test_chat_completion_validates_against_openai_types(fake_vllm: str) -> None:
    async with httpx.AsyncClient(base_url=fake_vllm) as h:
        body = {
            "model": "simulated-llm", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 12,
            "logprobs": True, "return_token_ids": True,
        }  # fmt: skip
        raw = (await h.post("/v1/chat/completions", json=body)).json()
    parsed = ChatCompletion.model_validate(raw)  # raises on any schema drift the SDK knows about
    choice = parsed.choices[0]
    assert choice.finish_reason == "length" and choice.logprobs is not None and choice.logprobs.content
    assert len(raw["choices"][0]["token_ids"]) == 12 == len(choice.logprobs.content)
    assert raw["prompt_token_ids"] and raw["usage"]["completion_tokens"] == 12
    assert raw["system_fingerprint"] == "vllm-0.32.0-simulated"


async def test_completion_and_models_through_the_sdk(fake_vllm: str) -> None:
    sdk = openai.AsyncOpenAI(base_url=f"{fake_vllm}/v1", api_key="unused")
    completion = await sdk.completions.create(
        model="simulated-llm", prompt="hello", max_tokens=5, logprobs=1, extra_body={"return_token_ids": True}
    )
    assert isinstance(completion, Completion)
    choice = completion.choices[0]
    assert choice.logprobs is not None and len(choice.logprobs.token_logprobs or []) == 5
    assert len(choice.model_extra["token_ids"]) == 5  # type: ignore[index]
    models = await sdk.models.list()
    assert [m.id for m in models.data] == ["simulated-llm"]
    with pytest.raises(openai.NotFoundError):
        await sdk.chat.completions.create(model="gpt-x", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.BadRequestError):
        await sdk.chat.completions.create(
            model="simulated-llm", messages=[{"role": "user", "content": "x"}], n=2
        )
    await sdk.close()


async def test_metrics_use_vllm_names(fake_vllm: str) -> None:
    async with httpx.AsyncClient(base_url=fake_vllm) as h:
        await h.post("/v1/completions", json={"prompt": "x", "max_tokens": 3})
        text = (await h.get("/metrics")).text
    for name in (
        metrics.VLLM_NUM_REQUESTS_RUNNING,
        metrics.VLLM_NUM_REQUESTS_WAITING,
        metrics.VLLM_KV_CACHE_USAGE_PERC,
    ):
        assert f"{name}{{" in text
    assert 'vllm:generation_tokens_total{engine="0",model_name="simulated-llm"} 3.0' in text
    for name in (metrics.VLLM_PREFIX_CACHE_QUERIES, metrics.VLLM_PREFIX_CACHE_HITS):
        assert f"{name}_total{{" in text  # 0 without a prefix cache (the default)


async def test_client_disconnect_aborts_the_request(
    fake_vllm: str, sim_engine: engine.SimulatedEngine, wait_until: WaitUntil
) -> None:
    async with httpx.AsyncClient(base_url=fake_vllm) as h:
        task = asyncio.create_task(
            h.post("/v1/completions", json={"prompt": "x", "max_tokens": 100_000 // 100})
        )
        await wait_until(lambda: bool(sim_engine.running))
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    await wait_until(lambda: not sim_engine.running)
    assert not sim_engine.running and sim_engine.finished["abort"] == 1


async def test_pause_keep_freezes_and_resume_continues(
    fake_vllm: str, sim_engine: engine.SimulatedEngine, wait_until: WaitUntil
) -> None:
    async with httpx.AsyncClient(base_url=fake_vllm) as h:
        task = asyncio.create_task(h.post("/v1/completions", json={"prompt": "x", "max_tokens": 50}))
        await wait_until(lambda: sim_engine.generation_tokens_total >= 5)
        assert (await h.post("/pause", params={"mode": "keep"})).json() == {"status": "paused"}
        assert (await h.get("/is_paused")).json() == {"is_paused": True}
        frozen = sim_engine.generation_tokens_total
        await asyncio.sleep(0.05)
        assert sim_engine.generation_tokens_total <= frozen + 1 and not task.done()
        await h.post("/resume")
        body = (await task).json()
    assert body["choices"][0]["finish_reason"] == "length" and body["usage"]["completion_tokens"] == 50


async def test_pause_abort_ends_in_flight_requests(
    fake_vllm: str, sim_engine: engine.SimulatedEngine, wait_until: WaitUntil
) -> None:
    async with httpx.AsyncClient(base_url=fake_vllm) as h:
        task = asyncio.create_task(h.post("/v1/completions", json={"prompt": "x", "max_tokens": 1000}))
        await wait_until(lambda: bool(sim_engine.running))
        await h.post("/pause", params={"mode": "abort"})
        body = (await task).json()
        assert body["choices"][0]["finish_reason"] == "abort"
        waiting = asyncio.create_task(h.post("/v1/completions", json={"prompt": "x", "max_tokens": 2}))
        await asyncio.sleep(0.05)
        assert not waiting.done() and sim_engine.waiting == 1  # new requests wait while paused
        await h.post("/resume")
        assert (await waiting).json()["choices"][0]["finish_reason"] == "length"


async def test_weight_version_routes(fake_vllm: str) -> None:
    async with httpx.AsyncClient(base_url=fake_vllm) as h:
        assert (await h.get("/weight_info")).json() == {"weight_version": None}
        r = await h.post("/update_weight_version", json={"new_version": "step-4"})
        assert r.json() == {"success": True, "new_version": "step-4"}
        assert (await h.get("/weight_info")).json() == {"weight_version": "step-4"}
