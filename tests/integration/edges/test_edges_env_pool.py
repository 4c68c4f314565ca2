"""Env servers added and removed while the scheduler runs, with real env server processes.

The scheduler starts with one env server; a second process starts mid-run and enters the resolved
set (the resolver is the seam ``scheduler.__main__.refresh_envs`` calls, DNS in a pod): trajectories
submitted after that land on it as the id hash says. Then the first leaves the set while sessions
are open on it: they finish there, and new trajectories all go to the second.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import httpx

from treadle import metrics
from treadle.api import jobconfig
from treadle.services.agent import client as agent_client
from treadle.services.buffer import service as buffer_service
from treadle.services.buffer import store
from treadle.services.env import client as env_client
from treadle.services.placement import service as placement_service
from treadle.services.reward import client as reward_client
from treadle.services.scheduler import __main__ as scheduler_main
from treadle.services.scheduler import protocol, service
from treadle.testing import procs
from treadle.v1 import placement_pb2

GROUP = 4
WaitUntil = Callable[[Callable[[], bool]], Awaitable[None]]  # the edges conftest's ``wait_until``


def healthy(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


@contextlib.contextmanager
def env_process() -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    port = procs.free_port()
    argv = [sys.executable, "-m", "treadle.services.env", "--host", "127.0.0.1", "--port", str(port)]
    with procs.running("env", argv, lambda: healthy(port), timeout=60) as proc:
        yield f"http://127.0.0.1:{port}", proc


@contextlib.asynccontextmanager
async def scheduler(
    pool: env_client.EnvPool, agent_url: str, reward_url: str
) -> AsyncIterator[service.SchedulerService]:
    placement = placement_service.PlacementService(
        pools={"decode": "decode-heavy"}, tasks={"math": jobconfig.TaskPlacement("decode-heavy")}
    )
    placement.register_worker(placement_pb2.Worker(worker_id="w0", pool="decode", address=agent_url))
    agent = agent_client.AgentClient(agent_url)
    reward = reward_client.RewardClient(reward_url, timeout_s=5.0)
    svc = service.SchedulerService(
        tasks={
            "math": jobconfig.TaskConfig(
                name="math", env="math-tool", reward_fn="math", group_size=GROUP, max_turns=2, max_tokens=8
            )
        },
        settings=jobconfig.Settings(alpha=8, batch_size=GROUP, backoff_s=0.05),
        envs=pool.clients, agent_for=lambda address: agent, placement=placement_service.InProcess(placement),
        reward=reward, buffer=buffer_service.BufferService(store=store.MemoryStore(), alpha=8),
    )  # fmt: skip
    try:
        yield svc
    finally:
        await svc.aclose()
        await agent.aclose()
        await reward.aclose()


async def run_groups(svc: service.SchedulerService, *group_ids: str) -> list[str]:
    """Submit the groups and wait for every trajectory; the statuses."""
    results = svc.results()
    await svc.submit([protocol.PromptGroup(group_id=g, task="math", seed=i) for i, g in enumerate(group_ids)])
    out: list[str] = []
    async with asyncio.timeout(60):
        async for r in results:
            out.append(r.status if r.status == "completed" else f"{r.status}: {r.reason}")
            if len(out) == GROUP * len(group_ids):
                return out
    raise AssertionError("unreachable")


def hashed_to(index: int, servers: int, *group_ids: str) -> int:
    """How many of the groups' trajectories the scheduler's id hash sends to server ``index``."""
    return sum(
        1 for g in group_ids for i in range(GROUP) if zlib.crc32(f"{g}-{i}".encode()) % servers == index
    )


async def opened(url: str) -> int:
    probe = env_client.EnvClient(url)
    try:
        return (await probe.stats()).opened
    finally:
        await probe.aclose()


async def test_an_env_server_added_mid_run_gets_new_trajectories(
    agent: str, reward_server: str, wait_until: WaitUntil
) -> None:
    with env_process() as (first, _):
        resolved = [first]
        pool = env_client.EnvPool(resolved)
        async with scheduler(pool, agent, reward_server) as svc:
            refreshing = asyncio.create_task(
                scheduler_main.refresh_envs(svc, pool, lambda: list(resolved), interval_s=0.02)
            )
            try:
                assert await run_groups(svc, "a1") == ["completed"] * GROUP
                assert await opened(first) == GROUP
                with env_process() as (second, _):
                    resolved.append(second)
                    await wait_until(lambda: svc.registry.get_sample_value(metrics.SCHED_ENV_SERVERS) == 2)
                    assert await run_groups(svc, "b1", "b2", "b3") == ["completed"] * 3 * GROUP
                    on_second = hashed_to(pool.urls.index(second), 2, "b1", "b2", "b3")
                    assert on_second > 0, "the test needs a trajectory that hashes to the new server"
                    assert await opened(second) == on_second
                    assert await opened(first) == GROUP + 3 * GROUP - on_second

                    # The first server leaves the set while the next groups run: nothing fails.
                    before = await opened(first)
                    leaving = asyncio.create_task(run_groups(svc, "c1", "c2"))
                    resolved.remove(first)
                    assert await leaving == ["completed"] * 2 * GROUP
                    await wait_until(lambda: svc.registry.get_sample_value(metrics.SCHED_ENV_SERVERS) == 1)
                    assert pool.urls == [second]
                    left = await opened(first)
                    assert await run_groups(svc, "d1") == ["completed"] * GROUP
                    assert await opened(first) == left  # a gone server gets no new session
                    assert await opened(second) == on_second + (2 * GROUP - (left - before)) + GROUP
            finally:
                refreshing.cancel()
                await asyncio.gather(refreshing, return_exceptions=True)
                await pool.aclose()
