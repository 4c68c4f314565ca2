"""The trainer's weight swap and a rebalancing move never interleave on one worker, and a trainer that
read the worker's agent before it moved leaves it alone (the race of docs/MULTI_AGENT.md).

A real inference agent (HTTP on 127.0.0.1) serving the executor's weights, the SIMULATED engine
behind it (it takes labels, not weights), placement's ``HttpSwapper`` and the trainer's
``EngineSwapper``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest

from treadle import errors
from treadle.services.agent import client as agent_client
from treadle.services.agent import http_app as agent_app
from treadle.services.fakevllm import http_app as fake_app
from treadle.services.httputil import serve
from treadle.services.placement import rebalance
from treadle.trainer import engines
from treadle.v1 import placement_pb2


@pytest.fixture
async def worker() -> AsyncIterator[engines.Replica]:
    async with serve.running(fake_app.build_app()) as engine_url:
        app = agent_app.build_app(engine_url=engine_url, worker_id="w0", agent="executor")
        async with serve.running(app) as agent_url:
            yield engines.Replica("w0", engine_url, agent_url)


async def label(r: engines.Replica) -> str:
    async with httpx.AsyncClient(timeout=10) as http:
        return str((await http.get(f"{r.engine_url}/weight_info")).json()["weight_version"])


async def test_a_trainer_that_read_the_donor_leaves_a_moved_worker_alone(worker: engines.Replica) -> None:
    executor = engines.EngineSwapper([worker], extension=False, agent="executor", contended_retries=0)
    await executor.swap(4)
    assert (await label(worker), executor.served, executor.moved) == ("4", {"w0": 4}, {})
    # Placement moves the worker to the planner (its version 2)...
    moved = placement_pb2.Worker(worker_id="w0", pool="plan", address=worker.agent_url)
    moved.engine_address = worker.engine_url
    await rebalance.HttpSwapper().swap(moved, agent="planner", version=2)
    # ...after the executor's trainer read that it serves the executor: its next version is refused
    # by the worker's agent, the trainer reads the agent again and leaves the worker to the planner.
    await executor.swap(5)
    assert await label(worker) == agent_client.label("planner", 2)
    assert (executor.served, executor.moved) == ({"w0": 4}, {"w0": "planner"})
    planner = engines.EngineSwapper([worker], extension=False, agent="planner", contended_retries=0)
    await planner.swap(3)
    assert await label(worker) == "3"
    # Moved back, the executor's trainer swaps it again.
    await rebalance.HttpSwapper().swap(moved, agent="executor", version=5)
    await executor.swap(6)
    assert (await label(worker), executor.served, executor.moved) == ("6", {"w0": 6}, {})


async def test_one_swap_at_a_time_per_worker(worker: engines.Replica) -> None:
    client = agent_client.AgentClient(worker.agent_url)
    try:
        await client.pause("wait")  # a swap under way (a move's) holds the worker
        with pytest.raises(agent_client.SwapContended):
            await agent_client.swap(
                worker.agent_url, worker.engine_url, label="9", apply_version=None, timeout_s=10
            )
        trainer = engines.EngineSwapper([worker], extension=False, agent="executor", contended_retries=0)
        with pytest.raises(agent_client.SwapRefused):
            await trainer.swap(9)
        assert await label(worker) != "9" and trainer.served == {"w0": 0}
        await client.resume()  # the swap under way ends; the next one goes through
        await trainer.swap(9)
        assert await label(worker) == "9" and (await client.load()).agent == "executor"
    finally:
        await client.aclose()


async def test_a_pause_whose_caller_never_resumes_is_resumed_when_its_lease_ends() -> None:
    async with serve.running(fake_app.build_app()) as engine_url:
        app = agent_app.build_app(engine_url=engine_url, worker_id="w0", agent="executor", swap_lease_s=2.0)
        async with serve.running(app) as agent_url:
            worker = engines.Replica("w0", engine_url, agent_url)
            client = agent_client.AgentClient(agent_url)
            try:
                late = await client.pause("wait")  # the caller (say placement, mid-move) hangs here
                async with httpx.AsyncClient(timeout=10) as http:
                    assert (await http.get(f"{engine_url}/is_paused")).json()["is_paused"] is True
                    trainer = engines.EngineSwapper([worker], extension=False, agent="executor")
                    # Bounded: the lease ends after 2 s (the check above must come first, under load too); the
                    # trainer retries contended swaps 1 s apart.
                    await asyncio.wait_for(trainer.swap(7), timeout=20)
                    assert await label(worker) == "7"
                    assert (await http.get(f"{engine_url}/is_paused")).json()["is_paused"] is False
                    scraped = (await http.get(f"{agent_url}/metrics")).text
                assert "treadle_agent_swap_leases_expired_total 1.0" in scraped
                # The hung caller wakes up during the next caller's swap: its resume is refused and the
                # engine stays paused for the swap under way.
                current = await client.pause("wait")
                with pytest.raises(errors.Conflict):
                    await client.resume(swap_id=late)
                async with httpx.AsyncClient(timeout=10) as http:
                    assert (await http.get(f"{engine_url}/is_paused")).json()["is_paused"] is True
                await client.resume(swap_id=current)
            finally:
                await client.aclose()
