"""The job's token on every kind of gRPC call (issue 32): the four call kinds through
``grpcutil.channel``, and every streaming method of the services (``Scheduler/StreamResults``,
``Buffer/StreamBatch``) through the project's own clients, each against an in-process server on
127.0.0.1 that requires the token: with it the stream delivers, without it (or with another job's) the
call is refused. Local mode's results collector says when its stream fails instead of ending quietly.

grpc.aio files a client interceptor under the first call kind it implements, so a single interceptor
for unary-unary and unary-stream sent the token on unary calls only: every stream was refused, and
``treadle run`` summarized no results (mean reward 0.0, 0 output tokens).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any, cast

import dataplane_fakes as fakes
import grpc
import pytest

from treadle import auth, errors
from treadle.api import jobconfig
from treadle.localmode import run as run_mod
from treadle.services.buffer import client as buffer_client
from treadle.services.buffer import grpc_server as buffer_grpc
from treadle.services.buffer import service as buffer_service
from treadle.services.buffer import store
from treadle.services.grpcutil import channel
from treadle.services.grpcutil import server as grpcutil_server
from treadle.services.placement import service as placement_service
from treadle.services.scheduler import client as scheduler_client
from treadle.services.scheduler import grpc_server as scheduler_grpc
from treadle.services.scheduler import protocol, service
from treadle.v1 import buffer_pb2, common_pb2, placement_pb2, scheduler_pb2

TOKEN = auth.new_token()
OTHER_JOB = auth.new_token()
REFUSALS = {None: "missing authorization header", OTHER_JOB: "is not this job's"}
"""The callers without this job's token, and why the server refuses each."""

# --- the four call kinds through grpcutil.channel ------------------------------------------------------

ECHO = "treadle.test.Echo"


async def _unary_unary(req: bytes, ctx: Any) -> bytes:
    return req


async def _unary_stream(req: bytes, ctx: Any) -> AsyncIterator[bytes]:
    yield req
    yield req


async def _stream_unary(reqs: AsyncIterator[bytes], ctx: Any) -> bytes:
    return b"".join([r async for r in reqs])


async def _stream_stream(reqs: AsyncIterator[bytes], ctx: Any) -> AsyncIterator[bytes]:
    async for r in reqs:
        yield r


ECHO_HANDLERS = {
    "UnaryUnary": grpc.unary_unary_rpc_method_handler(_unary_unary),
    "UnaryStream": grpc.unary_stream_rpc_method_handler(_unary_stream),
    "StreamUnary": grpc.stream_unary_rpc_method_handler(_stream_unary),
    "StreamStream": grpc.stream_stream_rpc_method_handler(_stream_stream),
}


async def _collect(stream: Any) -> list[bytes]:
    return [m async for m in stream]


def _method(name: str) -> str:
    return f"/{ECHO}/{name}"


SENT = [b"c", b"d"]
# Each kind's call of ``msgs`` (raw bytes, no serializers; a unary request joins them) and what the
# echo service answers to SENT.
CALLS: dict[str, tuple[Callable[[grpc.aio.Channel, list[bytes]], Awaitable[Any]], Any]] = {
    "UnaryUnary": (lambda ch, msgs: ch.unary_unary(_method("UnaryUnary"))(b"".join(msgs), timeout=10),
                   b"cd"),
    "UnaryStream": (
        lambda ch, msgs: _collect(ch.unary_stream(_method("UnaryStream"))(b"".join(msgs), timeout=10)),
        [b"cd", b"cd"],
    ),
    "StreamUnary": (lambda ch, msgs: ch.stream_unary(_method("StreamUnary"))(iter(msgs), timeout=10),
                    b"cd"),
    "StreamStream": (
        lambda ch, msgs: _collect(ch.stream_stream(_method("StreamStream"))(iter(msgs), timeout=10)),
        SENT,
    ),
}  # fmt: skip


@pytest.fixture
async def echo() -> AsyncIterator[str]:
    """A server of all four call kinds behind the job's token, served as every Treadle service is."""
    handler = grpc.method_handlers_generic_handler(ECHO, ECHO_HANDLERS)
    served = await grpcutil_server.start(
        [lambda s: s.add_generic_rpc_handlers((handler,))], services=[ECHO], token=TOKEN
    )
    try:
        yield f"127.0.0.1:{served.port}"
    finally:
        await served.stop(None)


@pytest.mark.parametrize("kind", CALLS)
async def test_every_call_kind_carries_the_jobs_token(echo: str, kind: str) -> None:
    call, answer = CALLS[kind]
    async with channel.open_channel(echo, token=TOKEN) as ch:
        assert await call(ch, SENT) == answer
    for token, reason in REFUSALS.items():
        async with channel.open_channel(echo, token=token) as ch:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                # No messages: a client still writing when the server refuses sees grpc's own INTERNAL
                # ("Internal error from Core", a write after the call ended) instead of the status.
                await call(ch, [])
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED, (kind, token)
        assert reason in (refused.value.details() or ""), (kind, token)


# --- Scheduler/StreamResults through SchedulerClient ---------------------------------------------------


@dataclasses.dataclass
class Scheduler:
    address: str
    svc: service.SchedulerService
    subscribed: asyncio.Event
    """Set once a StreamResults call reached the service (nothing published before is streamed)."""

    def client(self, token: str | None) -> scheduler_client.SchedulerClient:
        return scheduler_client.SchedulerClient(self.address, token=token)

    async def until_subscribed(self, first: asyncio.Future[Any]) -> None:
        async with asyncio.timeout(10):
            while not self.subscribed.is_set():
                if first.done():
                    first.result()  # a refused stream raises here
                    raise AssertionError("the stream ended before subscribing")
                await asyncio.sleep(0.01)


@pytest.fixture
async def scheduler(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Scheduler]:
    """The real scheduler (in-process fakes of env, agent and reward, as in test_scheduler) behind the
    job's token."""
    placement = placement_service.PlacementService(
        pools={"decode": "decode-heavy"}, tasks={"math": jobconfig.TaskPlacement("decode-heavy")}
    )
    placement.register_worker(placement_pb2.Worker(worker_id="w0", pool="decode", address="a0"))
    agent = fakes.Agent()
    svc = service.SchedulerService(
        tasks={"math": jobconfig.TaskConfig(name="math", env="math-tool", group_size=4, max_turns=3)},
        settings=jobconfig.Settings(alpha=1, batch_size=8, max_in_flight=64, backoff_s=0.0),
        envs=[fakes.Env()],
        agent_for=lambda address: agent,
        placement=placement_service.InProcess(placement),
        reward=fakes.Reward(),
        buffer=buffer_service.BufferService(store=store.MemoryStore(), alpha=1),
    )
    subscribed = asyncio.Event()
    subscribe = svc.results

    def results(**kw: Any) -> AsyncIterator[protocol.TrajectoryResult]:
        stream = subscribe(**kw)
        subscribed.set()
        return stream

    monkeypatch.setattr(svc, "results", results)
    served = await scheduler_grpc.build_server(svc, token=TOKEN)
    try:
        yield Scheduler(f"127.0.0.1:{served.port}", svc, subscribed)
    finally:
        await served.stop(None)
        await svc.aclose()


def _assert_real_results(results: list[scheduler_pb2.TrajectoryResult]) -> None:
    """The group's four trajectories, with what ``treadle run``'s summary reads from them."""
    assert sorted(r.trajectory_id for r in results) == [f"g1-{i}" for i in range(4)]
    for r in results:
        assert (r.status, r.reward, r.turns, r.output_tokens) == ("completed", 1.0, 2, 4), r
        assert r.seconds > 0.0, r


async def test_the_schedulers_results_stream_carries_the_jobs_token(scheduler: Scheduler) -> None:
    client = scheduler.client(TOKEN)
    stream = cast(AsyncGenerator[scheduler_pb2.TrajectoryResult, None], client.results())
    try:
        first = asyncio.ensure_future(anext(stream))
        await scheduler.until_subscribed(first)
        await client.submit([scheduler_pb2.PromptGroup(group_id="g1", task="math")])
        async with asyncio.timeout(10):
            results = [await first] + [await anext(stream) for _ in range(3)]
        _assert_real_results(results)
    finally:
        await stream.aclose()
        await client.aclose()
    for token, reason in REFUSALS.items():
        forger = scheduler.client(token)
        try:
            with pytest.raises(errors.Unauthenticated, match=reason) as refused:
                await anext(forger.results())
            assert "Scheduler/StreamResults" in str(refused.value)
        finally:
            await forger.aclose()


async def test_local_modes_collector_gathers_the_stream_and_reports_a_failed_one(
    scheduler: Scheduler,
) -> None:
    client = scheduler.client(TOKEN)
    results: list[scheduler_pb2.TrajectoryResult] = []
    rewards: list[float] = []
    lines: list[str] = []
    collector = asyncio.create_task(run_mod.collect_results(client, results, rewards, echo=lines.append))
    try:
        await scheduler.until_subscribed(collector)
        await client.submit([scheduler_pb2.PromptGroup(group_id="g1", task="math")])
        async with asyncio.timeout(10):
            while len(results) < 4:
                assert not collector.done(), lines
                await asyncio.sleep(0.01)
        _assert_real_results(results)
        assert rewards == [1.0] * 4 and lines == []
    finally:
        collector.cancel()
        await asyncio.gather(collector, return_exceptions=True)
        await client.aclose()
    # A stream that fails (here: refused) ends the collector with a line naming the status, not silently.
    forger = scheduler.client(None)
    try:
        await asyncio.wait_for(run_mod.collect_results(forger, [], [], echo=lines.append), timeout=10)
    finally:
        await forger.aclose()
    (line,) = lines
    assert "results stream failed with UNAUTHENTICATED after 0 results" in line, line
    assert "missing authorization header" in line, line


# --- Buffer/StreamBatch through BufferClient -----------------------------------------------------------


def _group(gid: str) -> list[common_pb2.Trajectory]:
    return [
        common_pb2.Trajectory(trajectory_id=f"{gid}-{i}", group_id=gid, task="math", group_size=2,
                              status="completed", reward=1.0)
        for i in range(2)
    ]  # fmt: skip


@pytest.fixture
async def buffer() -> AsyncIterator[str]:
    svc = buffer_service.BufferService(store=store.MemoryStore(), alpha=1, poll_s=0.01)
    served = await buffer_grpc.build_server(svc, token=TOKEN)
    try:
        yield f"127.0.0.1:{served.port}"
    finally:
        await served.stop(None)


async def test_the_buffers_batch_stream_carries_the_jobs_token(buffer: str) -> None:
    def stream(client: buffer_client.BufferClient) -> AsyncIterator[buffer_pb2.Batch]:
        return client.stream_batch(batch_size=4, micro_batch_size=2, version=0, timeout_s=5)

    job = buffer_client.BufferClient(buffer, token=TOKEN)
    try:
        await job.put([*_group("p1"), *_group("p2")])
        micro = [m async for m in stream(job)]
        assert [list(m.group_ids) for m in micro] == [["p1"], ["p2"]]
        assert [len(m.trajectories) for m in micro] == [2, 2] and micro[-1].last
    finally:
        await job.aclose()
    for token, reason in REFUSALS.items():
        forger = buffer_client.BufferClient(buffer, token=token)
        try:
            with pytest.raises(errors.Unauthenticated, match=reason) as refused:
                await anext(stream(forger))
            assert "Buffer/StreamBatch" in str(refused.value)
        finally:
            await forger.aclose()
