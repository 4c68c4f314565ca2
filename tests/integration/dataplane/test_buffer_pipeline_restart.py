"""FlexMARL's micro-batch pipeline survives a buffer crash on real Redis.

Two agents stream micro-batches from a buffer process, which is killed (SIGKILL) mid-step with one
micro-batch trained, one released and unacked, and the other agent half way. A new process on the
same Redis takes the acks of what the trainers were given, streams the rest of the step and closes
it with one unified update: no sample lost, none delivered or trained twice (a double count would
show as a rescale factor below 1, a lost state as a barrier that never opens).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from treadle import errors
from treadle.api import v1alpha1
from treadle.services import podenv
from treadle.services.buffer import client as buffer_client
from treadle.services.buffer import pipeline, redis_store, service, store
from treadle.testing import procs
from treadle.testing import redis_server as redis_server_mod
from treadle.v1 import buffer_pb2, common_pb2

AGENTS = ["planner", "executor"]
TWO_AGENTS = Path(__file__).parents[3] / "manifests" / "local" / "two-agent-rebalance.yaml"


def group(gid: str, agent: str, n: int = 2) -> list[common_pb2.Trajectory]:
    return [
        common_pb2.Trajectory(
            trajectory_id=f"{gid}-{i}", group_id=gid, task="plan-execute", agent=agent, group_size=n,
            status="completed", reward=1.0,
        )
        for i in range(n)
    ]  # fmt: skip


def job_env(directory: Path) -> dict[str, str]:
    """The buffer's job file: two agents (``AGENTS``) taking turns in task plan-execute, staleness 0."""
    raw = yaml.safe_load(TWO_AGENTS.read_text())
    raw["spec"]["rollout"]["staleness"] = 0
    return podenv.job_env(v1alpha1.parse_job(raw), directory)


@contextlib.contextmanager
def buffer_process(redis_url: str, namespace: str) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    port = procs.free_port()
    argv = [
        sys.executable, "-m", "treadle.services.buffer", "--host", "127.0.0.1", "--port", str(port),
        "--redis", redis_url, "--namespace", namespace,
    ]  # fmt: skip
    with (
        tempfile.TemporaryDirectory() as tmp,
        procs.running(
            "buffer", argv, lambda: procs.port_open(port), env=job_env(Path(tmp)), timeout=60
        ) as proc,
    ):
        yield f"127.0.0.1:{port}", proc


def crash(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)


async def stream(
    buffer: buffer_client.BufferClient, agent: str, *, take: int | None = None
) -> list[buffer_pb2.Batch]:
    """The agent's micro-batches of the step (target 4, micro-batch 2); ``take``: stop after that many."""
    got: list[buffer_pb2.Batch] = []
    async for micro in buffer.stream_batch(
        batch_size=4, micro_batch_size=2, version=0, timeout_s=10, agent=agent
    ):
        got.append(micro)
        if len(got) == take:
            break  # the trainer has what it holds when the buffer dies
    return got


def ids(batches: list[buffer_pb2.Batch]) -> list[str]:
    return [t.trajectory_id for b in batches for t in b.trajectories]


async def test_a_restarted_buffer_finishes_the_step_with_one_update(
    redis_server: redis_server_mod.RedisServer,
) -> None:
    namespace = uuid.uuid4().hex
    stored = redis_store.RedisStore.from_url(redis_server.url, namespace=namespace)
    try:
        with buffer_process(redis_server.url, namespace) as (address, proc):
            first = buffer_client.BufferClient(address)
            await first.put([*group("p1", "planner"), *group("p2", "planner"), *group("e1", "executor")])
            planner = await stream(first, "planner")
            assert [(list(m.group_ids), m.last) for m in planner] == [(["p1"], False), (["p2"], True)]
            await first.ack(planner[0].batch_id)
            executor = await stream(first, "executor", take=1)
            assert [list(m.group_ids) for m in executor] == [["e1"]]
            crash(proc)
            await first.aclose()

        with buffer_process(redis_server.url, namespace) as (address, _):
            buffer = buffer_client.BufferClient(address)
            before = await stored.pipeline_state()
            assert before is not None
            # Bad input to the new process changes nothing stored.
            with pytest.raises(errors.SpecError) as bad:
                await buffer.ack("x\ny")
            assert bad.value.field == "batch_id"
            with pytest.raises(errors.NotFound):
                await buffer.ack(planner[0].batch_id)  # acked before the crash: not trained twice
            with pytest.raises(errors.Conflict, match="batch_size 4, not 8"):
                async for _ in buffer.stream_batch(
                    batch_size=8, micro_batch_size=2, version=0, timeout_s=1, agent="executor"
                ):
                    pass
            assert await stored.pipeline_state() == before

            waiting = asyncio.create_task(buffer.await_update(agent="planner", timeout_s=30))
            await buffer.ack(planner[1].batch_id)
            await buffer.ack(executor[0].batch_id)
            await buffer.put(group("e2", "executor"))
            rest = await stream(buffer, "executor")
            assert [(list(m.group_ids), m.loss_scale, m.last) for m in rest] == [(["e2"], 0.5, True)]
            assert not waiting.done()  # the executor's second micro-batch is not trained yet
            await buffer.ack(rest[0].batch_id)
            update = await asyncio.wait_for(waiting, timeout=30)
            assert update.step == 0
            assert {r.agent: r.factor for r in update.rescale} == {"planner": 1.0, "executor": 1.0}
            assert update == await buffer.await_update(agent="executor", timeout_s=0)

            delivered = ids(planner) + ids(executor) + ids(rest)
            assert sorted(delivered) == sorted(f"{g}-{i}" for g in ("p1", "p2", "e1", "e2") for i in (0, 1))
            stats = await buffer.stats()
            assert (stats.put, stats.delivered, stats.acked, stats.redelivered, stats.stored) == (
                8,
                8,
                8,
                0,
                0,
            )
            await buffer.aclose()

        # The closed step stays closed: a third process answers late trainers with the same update.
        with buffer_process(redis_server.url, namespace) as (address, _):
            buffer = buffer_client.BufferClient(address)
            assert await buffer.await_update(agent="planner", timeout_s=0) == update
            await buffer.aclose()
        saved = await stored.pipeline_state()
        assert saved is not None
        state = pipeline.load(saved, agents=AGENTS)
        assert state.step == 1 and not state.states and not state.batches
    finally:
        await stored.aclose()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("backend", ["memory", "redis"])
async def test_a_micro_batch_whose_lease_ends_unacked_is_released_again(
    backend: str, redis_server: redis_server_mod.RedisServer
) -> None:
    s: store.Store = (
        store.MemoryStore()
        if backend == "memory"
        else redis_store.RedisStore.from_url(redis_server.url, namespace=uuid.uuid4().hex)
    )
    clock = Clock()
    svc = service.BufferService(store=s, alpha=0, poll_s=0.01, clock=clock)
    try:
        await svc.put(group("g", ""))
        lost = [m async for m in svc.stream_batch(batch_size=2, micro_batch_size=2, version=0, timeout_s=5)]
        assert [list(m.group_ids) for m in lost] == [["g"]]
        clock.now += svc.default_lease_s  # the trainer never acks
        again = [m async for m in svc.stream_batch(batch_size=2, micro_batch_size=2, version=0, timeout_s=5)]
        assert [list(m.group_ids) for m in again] == [["g"]] and again[0].batch_id != lost[0].batch_id
        with pytest.raises(errors.NotFound):
            await svc.ack(lost[0].batch_id)
        assert await svc.ack(again[0].batch_id) == 2
        update = await svc.await_update(agent="", timeout_s=5)
        assert update.step == 0 and list(update.rescale) == [buffer_pb2.AgentRescale(agent="", factor=1.0)]
        saved = await s.pipeline_state()
        assert saved is not None and pipeline.load(saved, agents=()).step == 1
    finally:
        await s.aclose()
