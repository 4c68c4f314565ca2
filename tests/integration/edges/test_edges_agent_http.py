"""The inference agent over HTTP in front of the simulated vLLM: ADD/ABORT, versions, load, pause."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

import httpx
import pytest

from treadle import errors
from treadle.services.agent import client as agent_client
from treadle.services.agent import protocol
from treadle.services.fakevllm import engine

WaitUntil = Callable[[Callable[[], bool]], Awaitable[None]]


def gen(tid: str, turn: int = 0, max_tokens: int = 8, **kw: object) -> protocol.GenerateRequest:
    return protocol.GenerateRequest.model_validate(
        {"trajectory_id": tid, "turn": turn, "messages": [{"role": "user", "content": f"task {tid}"}],
         "max_tokens": max_tokens, **kw}
    )  # fmt: skip


async def test_generate_records_ids_logprobs_and_versions(agent: str, fake_vllm: str) -> None:
    c = agent_client.AgentClient(agent)
    first = await c.generate(gen("t1"))
    assert first.finish_reason == "length" and len(first.output_token_ids) == 8
    assert first.engine_seconds >= 8 * 0.002  # the agent reports its engine call's time (8 steps of 2 ms)
    assert len(first.output_logprobs) == 8 and first.output_versions == [0] * 8 and first.prompt_token_ids
    async with httpx.AsyncClient(base_url=fake_vllm) as h:
        await h.post("/update_weight_version", json={"new_version": "step-3"})
    await c.pause("keep")
    await c.resume()  # the agent re-reads the loaded version on resume
    second = await c.generate(gen("t1", turn=1))
    assert second.output_versions == [3] * 8 and second.output_token_ids != first.output_token_ids
    assert (await c.load()).policy_version == 3
    await c.aclose()


async def test_abort_cancels_the_engine_request(
    agent: str, sim_engine: engine.SimulatedEngine, wait_until: WaitUntil
) -> None:
    c = agent_client.AgentClient(agent)
    task = asyncio.create_task(c.generate(gen("long", max_tokens=1500)))
    await wait_until(lambda: bool(sim_engine.running))
    assert (await c.load()).running == 1
    assert await c.abort("long") is True
    result = await task
    assert result.finish_reason == "abort" and result.output_token_ids == []
    await wait_until(lambda: not sim_engine.running)
    assert not sim_engine.running and sim_engine.finished["abort"] == 1  # the engine stopped too
    assert await c.abort("long") is False and await c.abort("never-seen") is False
    await c.aclose()


async def test_abort_after_the_caller_hung_up_still_cancels_the_engine_request(
    agent: str, sim_engine: engine.SimulatedEngine, wait_until: WaitUntil
) -> None:
    """The scheduler's order on a DARTS early stop or a cancelled trajectory: its own call is cancelled
    (the connection closes) and the ABORT follows. The engine request must not run on to its end: the
    agent keeps it in flight until it ends, not until its caller leaves."""
    c = agent_client.AgentClient(agent)
    task = asyncio.create_task(c.generate(gen("gone", max_tokens=1500)))
    await wait_until(lambda: bool(sim_engine.running))
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await asyncio.sleep(0.2)  # the agent has seen the connection close
    assert sim_engine.running  # a caller's hang-up alone does not stop it (a retry may join it)
    assert await c.abort("gone") is True
    await wait_until(lambda: not sim_engine.running)
    assert sim_engine.finished["abort"] == 1 and sim_engine.finished["length"] == 0
    await c.aclose()


async def test_retry_joins_and_other_turn_conflicts(
    agent: str, sim_engine: engine.SimulatedEngine, wait_until: WaitUntil
) -> None:
    c = agent_client.AgentClient(agent)
    a = asyncio.create_task(c.generate(gen("j", max_tokens=200)))
    await wait_until(lambda: bool(sim_engine.running))
    b = asyncio.create_task(c.generate(gen("j", max_tokens=200)))  # a retry of the same turn
    with pytest.raises(errors.Conflict):
        await c.generate(gen("j", turn=1))
    ra, rb = await asyncio.gather(a, b)
    assert ra == rb and sim_engine.finished["length"] == 1  # one engine request served both
    await c.aclose()


async def test_pause_abort_passthrough_returns_abort(
    agent: str, sim_engine: engine.SimulatedEngine, wait_until: WaitUntil
) -> None:
    c = agent_client.AgentClient(agent)
    task = asyncio.create_task(c.generate(gen("p", max_tokens=1500)))
    await wait_until(lambda: bool(sim_engine.running))
    await c.pause("abort")
    assert (await task).finish_reason == "abort"
    await c.resume()
    assert (await c.generate(gen("p", turn=1, max_tokens=2))).finish_reason == "length"
    await c.aclose()


async def test_engine_errors_map_to_the_contract(agent: str) -> None:
    c = agent_client.AgentClient(agent)
    with pytest.raises(errors.SpecError) as exc:
        await c.generate(gen("big", max_tokens=100_000))  # beyond the engine's max_model_len
    assert exc.value.field == "max_tokens"
    with pytest.raises(errors.SpecError) as exc:
        await c.generate(
            protocol.GenerateRequest.model_construct(trajectory_id="", turn=0, messages=[], max_tokens=1)
        )
    assert exc.value.field in ("trajectory_id", "messages")
    await c.aclose()
    dead = agent_client.AgentClient("http://127.0.0.1:9", timeout_s=2)
    with pytest.raises(errors.Unavailable):
        await dead.load()
    await dead.aclose()


async def test_load_reports_engine_waiting_and_health(agent: str, sim_engine: engine.SimulatedEngine) -> None:
    c = agent_client.AgentClient(agent)
    load = await c.load()
    assert (load.worker_id, load.healthy, load.running, load.waiting) == ("w0", True, 0, 0)
    await c.aclose()
