"""Every gRPC API over real sockets on 127.0.0.1: health, and bad input answered with a clear status
(malformed bytes, unknown ids, oversized payloads, invalid fields) that changes nothing stored.

The buffer runs on real Redis here; placement and the scheduler run with their real services (the
scheduler's dependencies are never reached, because every request below is rejected first).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from treadle.api import jobconfig
from treadle.services.buffer import client as buffer_client
from treadle.services.buffer import grpc_server as buffer_grpc
from treadle.services.buffer import redis_store
from treadle.services.buffer import service as buffer_service
from treadle.services.grpcutil import server as grpcutil_server
from treadle.services.placement import grpc_server as placement_grpc
from treadle.services.placement import service as placement_service
from treadle.services.scheduler import grpc_server as scheduler_grpc
from treadle.services.scheduler import service as scheduler_service
from treadle.testing import redis_server as redis_server_mod
from treadle.v1 import buffer_pb2, common_pb2, placement_pb2, scheduler_pb2

MAX_MESSAGE = 1024 * 1024


class Unreachable:
    """A dependency no test below may reach: every request is rejected before it."""

    def __getattr__(self, name: str) -> object:
        raise AssertionError(f"dependency called: {name}")


@pytest.fixture
async def servers(redis_server: redis_server_mod.RedisServer) -> AsyncIterator[dict[str, str]]:
    store = redis_store.RedisStore.from_url(redis_server.url, namespace=uuid.uuid4().hex)
    buf = buffer_service.BufferService(store=store, alpha=1, max_trajectory_bytes=64 * 1024)
    placement = placement_service.PlacementService(
        pools={"decode": "decode-heavy"}, tasks={"math": jobconfig.TaskPlacement("decode-heavy")}
    )
    sched = scheduler_service.SchedulerService(
        tasks={"math": jobconfig.TaskConfig(name="math", env="math-tool")},
        settings=jobconfig.Settings(),
        envs=[Unreachable()],  # type: ignore[list-item]
        agent_for=lambda address: Unreachable(),  # type: ignore[arg-type,return-value]
        placement=placement_service.InProcess(placement),
        reward=Unreachable(),  # type: ignore[arg-type]
        buffer=buf,
    )
    served = [
        await buffer_grpc.build_server(buf, max_message_bytes=MAX_MESSAGE),
        await placement_grpc.build_server(placement),
        await scheduler_grpc.build_server(sched),
    ]
    try:
        yield {
            name: f"127.0.0.1:{s.port}"
            for name, s in zip(("buffer", "placement", "scheduler"), served, strict=True)
        }
    finally:
        for s in served:
            await s.stop(None)
        await sched.aclose()
        await store.aclose()


async def call(address: str, method: str, request: bytes) -> grpc.aio.AioRpcError | bytes:
    """A unary call with raw bytes, as a client with a different (or broken) schema would send."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = channel.unary_unary(method, request_serializer=None, response_deserializer=None)
        try:
            reply: bytes = await stub(request, timeout=10)
        except grpc.aio.AioRpcError as exc:
            return exc
        return reply


def traj(tid: str, **kw: object) -> common_pb2.Trajectory:
    fields: dict[str, object] = {"trajectory_id": tid, "group_id": "g", "task": "math", "group_size": 2,
                                 "status": "completed", **kw}  # fmt: skip
    return common_pb2.Trajectory(**fields)  # type: ignore[arg-type]


async def buffer_stats(address: str) -> buffer_pb2.BufferStats:
    client = buffer_client.BufferClient(address)
    try:
        return await client.stats()
    finally:
        await client.aclose()


async def test_health_serving(servers: dict[str, str]) -> None:
    for name, service in [("buffer", "treadle.v1.Buffer"), ("placement", "treadle.v1.Placement"),
                          ("scheduler", "treadle.v1.Scheduler")]:  # fmt: skip
        assert await grpcutil_server.check_health(servers[name], service)
        async with grpc.aio.insecure_channel(servers[name]) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service="nope"))
            assert err.value.code() == grpc.StatusCode.NOT_FOUND


@pytest.mark.parametrize(
    ("service", "method"),
    [
        ("buffer", "/treadle.v1.Buffer/Put"),
        ("buffer", "/treadle.v1.Buffer/GetBatch"),
        ("placement", "/treadle.v1.Placement/Assign"),
        ("scheduler", "/treadle.v1.Scheduler/Submit"),
        ("scheduler", "/treadle.v1.Scheduler/CommitVersion"),
    ],
)
async def test_malformed_bytes_are_invalid_argument(
    servers: dict[str, str], service: str, method: str
) -> None:
    reply = await call(servers[service], method, b"\xff\xff\xff\xff\x0f")
    assert isinstance(reply, grpc.aio.AioRpcError)
    assert reply.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not a valid message" in (reply.details() or "")
    assert (await buffer_stats(servers["buffer"])).put == 0


async def test_buffer_rejects_bad_input_and_stores_nothing(servers: dict[str, str]) -> None:
    address = servers["buffer"]
    bad_field = buffer_pb2.PutRequest(trajectories=[traj("a"), traj("b", status="done")])
    reply = await call(address, "/treadle.v1.Buffer/Put", bad_field.SerializeToString())
    assert isinstance(reply, grpc.aio.AioRpcError) and reply.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (reply.details() or "").startswith("trajectories[1].status:")
    # over the per-trajectory limit (64 KiB here): INVALID_ARGUMENT naming the trajectory
    big = buffer_pb2.PutRequest(trajectories=[traj("c", prompt="x" * 100_000)])
    reply = await call(address, "/treadle.v1.Buffer/Put", big.SerializeToString())
    assert isinstance(reply, grpc.aio.AioRpcError) and reply.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (reply.details() or "").startswith("trajectories[0]:")
    # over the message limit (1 MiB here): refused by gRPC before any code runs
    huge = buffer_pb2.PutRequest(trajectories=[traj("d", prompt="x" * (2 * MAX_MESSAGE))])
    reply = await call(address, "/treadle.v1.Buffer/Put", huge.SerializeToString())
    assert isinstance(reply, grpc.aio.AioRpcError) and reply.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    # unknown batch id
    reply = await call(
        address, "/treadle.v1.Buffer/Ack", buffer_pb2.AckRequest(batch_id="nope").SerializeToString()
    )
    assert isinstance(reply, grpc.aio.AioRpcError) and reply.code() == grpc.StatusCode.NOT_FOUND
    # nothing ready within the timeout
    req = buffer_pb2.GetBatchRequest(batch_size=4, timeout_s=0.05)
    reply = await call(address, "/treadle.v1.Buffer/GetBatch", req.SerializeToString())
    assert isinstance(reply, grpc.aio.AioRpcError) and reply.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    stats = await buffer_stats(address)
    assert (stats.put, stats.stored) == (0, 0)


async def test_buffer_client_round_trip(servers: dict[str, str]) -> None:
    client = buffer_client.BufferClient(servers["buffer"])
    try:
        await client.put([traj("a"), traj("b")])
        batch = await client.get_batch(batch_size=2, version=0, timeout_s=1)
        assert sorted(t.trajectory_id for t in batch.trajectories) == ["a", "b"]
        assert await client.ack(batch.batch_id) == 2
        with pytest.raises(TimeoutError):  # DEADLINE_EXCEEDED comes back as the same exception
            async for _ in client.stream_batch(batch_size=2, micro_batch_size=1, version=0, timeout_s=0.05):
                pass
    finally:
        await client.aclose()


async def test_placement_rejects_bad_input_and_changes_nothing(servers: dict[str, str]) -> None:
    address = servers["placement"]
    before = await call(address, "/treadle.v1.Placement/PoolState", b"")
    cases = [
        ("/treadle.v1.Placement/RegisterWorker", placement_pb2.Worker(worker_id="w", pool="no", address="a"),
         grpc.StatusCode.INVALID_ARGUMENT, "pool:"),
        ("/treadle.v1.Placement/Assign", placement_pb2.AssignRequest(trajectory_id="t", task="nope"),
         grpc.StatusCode.INVALID_ARGUMENT, "task:"),
        ("/treadle.v1.Placement/Assign", placement_pb2.AssignRequest(trajectory_id="t", task="math"),
         grpc.StatusCode.UNAVAILABLE, "no healthy worker"),
        ("/treadle.v1.Placement/ReportLoad", placement_pb2.WorkerLoad(worker_id="ghost"),
         grpc.StatusCode.NOT_FOUND, "unknown worker"),
        ("/treadle.v1.Placement/Migrate", placement_pb2.MigrateRequest(from_worker_id="ghost"),
         grpc.StatusCode.NOT_FOUND, "unknown worker"),
    ]  # fmt: skip
    for method, req, code, text in cases:
        reply = await call(address, method, req.SerializeToString())
        assert isinstance(reply, grpc.aio.AioRpcError), method
        assert (reply.code(), text in (reply.details() or "")) == (code, True), (method, reply.details())
    assert await call(address, "/treadle.v1.Placement/PoolState", b"") == before


async def test_scheduler_rejects_bad_input_and_queues_nothing(servers: dict[str, str]) -> None:
    address = servers["scheduler"]
    groups = [
        scheduler_pb2.PromptGroup(group_id="ok", task="math"),
        scheduler_pb2.PromptGroup(group_id="x", task="?"),
    ]
    reply = await call(
        address,
        "/treadle.v1.Scheduler/Submit",
        scheduler_pb2.SubmitRequest(groups=groups).SerializeToString(),
    )
    assert isinstance(reply, grpc.aio.AioRpcError) and reply.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (reply.details() or "").startswith("groups[1].task:")
    # a version older than the committed one is a failed precondition
    ok = await call(
        address,
        "/treadle.v1.Scheduler/CommitVersion",
        scheduler_pb2.CommitVersionRequest(version=3).SerializeToString(),
    )
    assert isinstance(ok, bytes)
    old = await call(
        address,
        "/treadle.v1.Scheduler/CommitVersion",
        scheduler_pb2.CommitVersionRequest(version=2).SerializeToString(),
    )
    assert isinstance(old, grpc.aio.AioRpcError) and old.code() == grpc.StatusCode.FAILED_PRECONDITION
    raw = await call(address, "/treadle.v1.Scheduler/Stats", b"")
    assert isinstance(raw, bytes)
    stats = scheduler_pb2.SchedulerStats.FromString(raw)
    assert (stats.submitted, stats.pending, stats.version) == (0, 0, 3)
