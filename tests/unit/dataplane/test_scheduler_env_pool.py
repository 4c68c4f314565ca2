"""The scheduler's env servers change while it runs: new trajectories use the servers known now,
and an open session keeps the server it was opened on (``EnvPool``, ``SchedulerService.set_envs``)."""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import AsyncIterator, Callable

import dataplane_fakes as fakes
import pytest

from treadle import errors, metrics
from treadle.api import jobconfig
from treadle.services.buffer import service as buffer_service
from treadle.services.buffer import store
from treadle.services.env import client as env_client
from treadle.services.placement import service as placement_service
from treadle.services.scheduler import __main__ as scheduler_main
from treadle.services.scheduler import protocol, service
from treadle.v1 import placement_pb2

TASK = jobconfig.TaskConfig(name="math", env="math-tool", group_size=4, max_turns=2)


async def test_the_pool_follows_the_resolved_urls() -> None:
    a, b, c = "http://10.0.0.1:8080", "http://10.0.0.2:8080", "http://10.0.0.3:8080"
    pool = env_client.EnvPool([b, a])
    first = pool.clients
    assert pool.urls == [a, b] and len(first) == 2
    assert not pool.update([a, b]) and not pool.update([])  # same set; nothing resolved: keep
    assert pool.update([b, c])
    assert pool.urls == [b, c] and pool.clients[0] is first[1]  # b's client (and its sessions) stay
    assert pool.update([a, b, c]) and pool.clients[0] is first[0]  # a came back before it was reaped
    assert pool.update([c])
    assert await pool.reap() == [a, b]  # retired with no session open: closed
    assert pool.update([a, c]) and pool.clients[0] is not first[0]  # a new client for a
    await pool.aclose()


def test_env_urls_resolve_to_one_url_per_address() -> None:
    # An address literal resolves without DNS; a port-less URL keeps no port.
    assert scheduler_main.expand_headless("http://127.0.0.1:9000/") == ["http://127.0.0.1:9000/"]
    # TLS names the host: an https endpoint is kept as given, never turned into addresses.
    assert scheduler_main.expand_headless("https://envs.example.invalid/") == [
        "https://envs.example.invalid/"
    ]
    assert scheduler_main.resolve_envs(["http://127.0.0.1:9000", "http://127.0.0.2"]) == [
        "http://127.0.0.1:9000",
        "http://127.0.0.2",
    ]


@pytest.fixture
async def stack() -> AsyncIterator[tuple[service.SchedulerService, fakes.Env, fakes.Agent]]:
    env = fakes.Env(steps=2)
    agent = fakes.Agent()
    placement = placement_service.PlacementService(
        pools={"decode": "decode-heavy"}, tasks={"math": jobconfig.TaskPlacement("decode-heavy")}
    )
    placement.register_worker(placement_pb2.Worker(worker_id="w0", pool="decode", address="a0"))
    svc = service.SchedulerService(
        tasks={"math": TASK},
        settings=jobconfig.Settings(alpha=1, batch_size=8, max_in_flight=64, backoff_s=0.0),
        envs=[env], agent_for=lambda address: agent, placement=placement_service.InProcess(placement),
        reward=fakes.Reward(), buffer=buffer_service.BufferService(store=store.MemoryStore(), alpha=1),
    )  # fmt: skip
    yield svc, env, agent
    await svc.aclose()


async def until(predicate: Callable[[], bool]) -> None:
    for _ in range(10_000):  # event-loop turns only: the fakes never sleep
        if predicate():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition not reached")


def servers(svc: service.SchedulerService) -> float | None:
    return svc.registry.get_sample_value(metrics.SCHED_ENV_SERVERS)


async def test_new_trajectories_use_an_added_env_and_open_sessions_keep_theirs(
    stack: tuple[service.SchedulerService, fakes.Env, fakes.Agent],
) -> None:
    svc, first, agent = stack
    agent.hold = asyncio.Event()
    results = svc.results()
    await svc.submit([protocol.PromptGroup(group_id="g1", task="math", seed=1)])
    await until(lambda: len(first.sessions) == 4)
    added = fakes.Env(steps=2)
    svc.set_envs([first, added])
    assert servers(svc) == 2
    await svc.submit([protocol.PromptGroup(group_id="g2", task="math", seed=2)])
    g2 = [f"g2-{i}" for i in range(4)]
    on_added = {tid for tid in g2 if zlib.crc32(tid.encode()) % 2 == 1}
    assert on_added, "the test needs a g2 trajectory that hashes to the second server"
    await until(lambda: len(first.sessions) + len(added.sessions) == 8)
    assert set(added.sessions) == on_added
    svc.set_envs([added])  # the first server leaves: its open sessions still finish there
    assert servers(svc) == 1
    with pytest.raises(errors.SpecError) as empty:
        svc.set_envs([])
    assert empty.value.field == "envs" and servers(svc) == 1
    agent.hold.set()
    finished: list[protocol.TrajectoryResult] = []
    async with asyncio.timeout(10):
        async for r in results:
            finished.append(r)
            if len(finished) == 8:
                break
    assert [r.status for r in finished] == ["completed"] * 8
    assert set(first.closed) == {f"g1-{i}" for i in range(4)} | (set(g2) - on_added)
    assert set(added.closed) == on_added
    await svc.submit([protocol.PromptGroup(group_id="g3", task="math", seed=3)])
    await until(lambda: len(added.closed) == len(on_added) + 4)
    assert set(first.closed) == {f"g1-{i}" for i in range(4)} | (set(g2) - on_added)
