"""A trainer started before the job's scheduler answers waits for it (``connect.wait_for``), over a real
gRPC channel on 127.0.0.1: the scheduler's port refuses connections for a while, then a real
scheduler server starts there, and the first call goes through, logged with what it waited for.

On the dev cluster the same wait covers the scheduler's Service name that does not resolve yet (gRPC
answers that ``UNAVAILABLE`` too); ``treadle.trainer.job`` makes its first scheduler call this way.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from treadle import errors
from treadle.api import jobconfig
from treadle.client import connect, retrying
from treadle.services.grpcutil import server as grpcutil_server
from treadle.services.placement import service as placement_service
from treadle.services.scheduler import client as scheduler_client
from treadle.services.scheduler import grpc_server as scheduler_grpc
from treadle.services.scheduler import service as scheduler_service
from treadle.testing import procs

pytestmark = pytest.mark.timeout(60)


class Unreachable:
    """A dependency the calls below never reach."""

    def __getattr__(self, name: str) -> object:
        raise AssertionError(f"dependency called: {name}")


def scheduler() -> scheduler_service.SchedulerService:
    placement = placement_service.PlacementService(
        pools={"decode": "decode-heavy"}, tasks={"math": jobconfig.TaskPlacement("decode-heavy")}
    )
    return scheduler_service.SchedulerService(
        tasks={"math": jobconfig.TaskConfig(name="math", env="math-tool")},
        settings=jobconfig.Settings(),
        envs=[Unreachable()],  # type: ignore[list-item]
        agent_for=lambda address: Unreachable(),  # type: ignore[arg-type,return-value]
        placement=placement_service.InProcess(placement),
        reward=Unreachable(),  # type: ignore[arg-type]
        buffer=Unreachable(),  # type: ignore[arg-type]
    )


async def test_the_first_call_waits_for_a_scheduler_that_starts_later(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level("INFO", logger=retrying.__name__)
    port = procs.free_port()
    address = f"127.0.0.1:{port}"
    client = scheduler_client.SchedulerClient(address)
    sched = scheduler()

    async def start_later() -> grpcutil_server.Served:
        await asyncio.sleep(2.0)
        return await scheduler_grpc.build_server(sched, port=port)

    began = time.monotonic()
    late = asyncio.create_task(start_later())
    try:
        stats = await connect.wait_for(client.stats, what=f"the scheduler at {address}", timeout_s=30.0)
        took = time.monotonic() - began
        assert stats.version == 0 and 2.0 <= took < 20.0, took
        said = [r.getMessage() for r in caplog.records if "waiting for" in r.getMessage()]
        assert said and all(f"waiting for the scheduler at {address}" in m for m in said), said
    finally:
        served = await late
        await served.stop(None)
        await client.aclose()
        await sched.aclose()


async def test_a_scheduler_that_never_comes_fails_naming_it() -> None:
    address = f"127.0.0.1:{procs.free_port()}"
    client = scheduler_client.SchedulerClient(address)
    try:
        with pytest.raises(errors.Unavailable, match=f"the scheduler at {address} did not answer within 2s"):
            await connect.wait_for(client.stats, what=f"the scheduler at {address}", timeout_s=2.0)
    finally:
        await client.aclose()
