"""Edge services served for real on 127.0.0.1 (uvicorn in the test's event loop, free ports)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from treadle.services.agent import http_app as agent_app
from treadle.services.env import http_app as env_app
from treadle.services.fakevllm import engine
from treadle.services.fakevllm import http_app as fake_app
from treadle.services.httputil import serve
from treadle.services.reward import http_app as reward_app


@pytest.fixture
def sim_engine() -> engine.SimulatedEngine:
    return engine.SimulatedEngine(step_s=0.002, eos_probability=0.0, max_model_len=2048)


@pytest.fixture
async def fake_vllm(sim_engine: engine.SimulatedEngine) -> AsyncIterator[str]:
    async with serve.running(fake_app.build_app(engine=sim_engine)) as url:
        yield url


@pytest.fixture
async def agent(fake_vllm: str) -> AsyncIterator[str]:
    async with serve.running(
        agent_app.build_app(engine_url=fake_vllm, worker_id="w0", poll_interval_s=0.05)
    ) as url:
        yield url


@pytest.fixture
async def env_server() -> AsyncIterator[str]:
    async with serve.running(env_app.build_app(step_timeout_s=5.0)) as url:
        yield url


@pytest.fixture
async def reward_server(fake_vllm: str) -> AsyncIterator[str]:
    app = reward_app.build_app(
        judge_url=fake_vllm, user_prefixes=("treadle.services.reward.examples",), timeout_s=5
    )
    async with serve.running(app) as url:
        yield url


WaitUntil = Callable[[Callable[[], bool]], Awaitable[None]]


@pytest.fixture
def wait_until() -> WaitUntil:
    """Poll ``predicate`` until true; bounded (10 s), for states that have no event to await."""

    async def wait(predicate: Callable[[], bool]) -> None:
        for _ in range(2000):
            if predicate():
                return
            await asyncio.sleep(0.005)
        raise AssertionError("condition not reached within 10 s")

    return wait
