"""A reward gateway scaled to zero: the scheduler's real reward client waits until it comes up.

Everything over real HTTP on 127.0.0.1: the environment server, the agent beside the simulated
engine, and the reward gateway, which starts only after the trajectories reach scoring (nothing
listens on its port before, as with a Service that has no endpoints yet).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

from treadle.api import jobconfig
from treadle.services.agent import client as agent_client
from treadle.services.buffer import service as buffer_service
from treadle.services.buffer import store
from treadle.services.env import client as env_client
from treadle.services.httputil import serve
from treadle.services.placement import service as placement_service
from treadle.services.reward import client as reward_client
from treadle.services.reward import http_app as reward_app
from treadle.services.scheduler import protocol, service
from treadle.testing import procs
from treadle.v1 import placement_pb2

GROUP = 2
WaitUntil = Callable[[Callable[[], bool]], Awaitable[None]]  # the edges conftest's ``wait_until``


@contextlib.asynccontextmanager
async def scheduler(
    env_url: str, agent_url: str, reward_url: str, **settings: float
) -> AsyncIterator[service.SchedulerService]:
    placement = placement_service.PlacementService(
        pools={"decode": "decode-heavy"}, tasks={"math": jobconfig.TaskPlacement("decode-heavy")}
    )
    placement.register_worker(placement_pb2.Worker(worker_id="w0", pool="decode", address=agent_url))
    env = env_client.EnvClient(env_url)
    agent = agent_client.AgentClient(agent_url)
    reward = reward_client.RewardClient(reward_url, timeout_s=5.0)
    svc = service.SchedulerService(
        tasks={
            "math": jobconfig.TaskConfig(
                name="math", env="math-tool", reward_fn="math", group_size=GROUP, max_turns=2, max_tokens=8
            )
        },
        settings=jobconfig.Settings(alpha=1, batch_size=GROUP, reward_attempts=2, backoff_s=0.05, **settings),
        envs=[env],
        agent_for=lambda address: agent,
        placement=placement_service.InProcess(placement),
        reward=reward,
        buffer=buffer_service.BufferService(store=store.MemoryStore(), alpha=1),
    )
    try:
        yield svc
    finally:
        await svc.aclose()
        for client in (env, agent, reward):
            await client.aclose()


async def results_of(svc: service.SchedulerService) -> list[protocol.TrajectoryResult]:
    results = svc.results()
    await svc.submit([protocol.PromptGroup(group_id="g", task="math", seed=1)])
    out = []
    async with asyncio.timeout(60):
        async for r in results:
            out.append(r)
            if len(out) == GROUP:
                return out
    raise AssertionError("unreachable")


async def test_a_gateway_that_starts_late_is_waited_for(
    env_server: str, agent: str, wait_until: WaitUntil
) -> None:
    port = procs.free_port()
    async with scheduler(env_server, agent, f"http://127.0.0.1:{port}", reward_unavailable_s=30.0) as svc:
        scoring = asyncio.create_task(results_of(svc))
        await wait_until(lambda: svc.reward_backlog() == GROUP)
        # Refused for 1 s, far past reward_attempts=2 with 50 ms backoff: only the time budget holds on.
        await asyncio.sleep(1.0)
        app = reward_app.build_app(judge_url="http://127.0.0.1:1", timeout_s=5)
        async with serve.running(app, port=port):
            results = await scoring
    assert [r.status for r in results] == ["completed"] * GROUP, [r.reason for r in results]


async def test_without_the_budget_the_attempts_run_out(env_server: str, agent: str) -> None:
    port = procs.free_port()
    async with scheduler(env_server, agent, f"http://127.0.0.1:{port}") as svc:
        results = await results_of(svc)
    assert [r.status for r in results] == ["failed"] * GROUP
    assert all(r.reason.startswith("reward: score failed after 2 attempts") for r in results), results
