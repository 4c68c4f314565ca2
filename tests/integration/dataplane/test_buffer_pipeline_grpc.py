"""FlexMARL's buffer side over gRPC on real Redis: per-agent tables, micro-batch release, and the
unified-update barrier that holds one agent's trainer until the other has trained its step."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest

from treadle import errors
from treadle.services.buffer import client as buffer_client
from treadle.services.buffer import grpc_server, redis_store, service
from treadle.testing import redis_server as redis_server_mod
from treadle.v1 import common_pb2


def group(gid: str, agent: str, n: int = 2) -> list[common_pb2.Trajectory]:
    return [
        common_pb2.Trajectory(
            trajectory_id=f"{gid}-{i}", group_id=gid, task="plan-execute", agent=agent, group_size=n,
            status="completed", reward=1.0,
        )
        for i in range(n)
    ]  # fmt: skip


@pytest.fixture
async def buffer(redis_server: redis_server_mod.RedisServer) -> AsyncIterator[buffer_client.BufferClient]:
    store = redis_store.RedisStore.from_url(redis_server.url, namespace=uuid.uuid4().hex)
    svc = service.BufferService(store=store, alpha=0, agents=["planner", "executor"], poll_s=0.01)
    served = await grpc_server.build_server(svc)
    client = buffer_client.BufferClient(f"127.0.0.1:{served.port}")
    try:
        yield client
    finally:
        await client.aclose()
        await served.stop(None)
        await store.aclose()


async def test_two_agents_release_micro_batches_and_update_together(
    buffer: buffer_client.BufferClient,
) -> None:
    await buffer.put([*group("p1", "planner"), *group("p2", "planner"), *group("e1", "executor")])
    planner = [
        m
        async for m in buffer.stream_batch(
            batch_size=4, micro_batch_size=2, version=0, timeout_s=5, agent="planner"
        )
    ]
    assert [(list(m.group_ids), m.loss_scale, m.last) for m in planner] == [
        (["p1"], 0.5, False),
        (["p2"], 0.5, True),
    ]
    for m in planner:
        await buffer.ack(m.batch_id)
    # The planner's trainer waits at the barrier while the executor's micro-batches are outstanding.
    planner_update = asyncio.create_task(buffer.await_update(agent="planner", timeout_s=10))
    executor = []
    async for m in buffer.stream_batch(
        batch_size=4, micro_batch_size=2, version=0, timeout_s=10, agent="executor"
    ):
        executor.append(m)
        if len(executor) == 1:  # the executor's second group arrives while its trainer streams
            assert not planner_update.done()
            await buffer.put(group("e2", "executor"))
    assert [list(m.group_ids) for m in executor] == [["e1"], ["e2"]]
    assert not planner_update.done()
    for m in executor:
        await buffer.ack(m.batch_id)
    update = await asyncio.wait_for(planner_update, timeout=10)
    assert update == await buffer.await_update(agent="executor", timeout_s=0)
    assert update.step == 0 and {r.agent: r.factor for r in update.rescale} == {
        "planner": 1.0,
        "executor": 1.0,
    }


async def test_bad_agent_is_refused_naming_the_field(buffer: buffer_client.BufferClient) -> None:
    with pytest.raises(errors.SpecError) as bad:
        await buffer.get_batch(batch_size=2, version=0, timeout_s=0, agent="x\ny")
    assert bad.value.field == "agent"
    with pytest.raises(errors.SpecError) as put:
        await buffer.put([*group("g", "planner")[:1], *group("g", "executor")[1:]])
    assert put.value.field == "trajectories[1]"
    assert (await buffer.stats()).stored == 0
