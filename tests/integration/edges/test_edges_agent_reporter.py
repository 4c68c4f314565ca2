"""The agent registers itself with a real placement server, reports its load, and registers again
after placement restarts and forgets it (placement answers NotFound to the next report)."""

from __future__ import annotations

import prometheus_client
import pytest

from treadle import errors
from treadle.api import jobconfig
from treadle.services.agent import reporter, service
from treadle.services.placement import grpc_server as placement_grpc
from treadle.services.placement import service as placement_service


def new_placement() -> placement_service.PlacementService:
    return placement_service.PlacementService(
        pools={"decode": "decode-heavy"}, tasks={"math": jobconfig.TaskPlacement("decode-heavy")}
    )


async def test_register_report_and_register_again_after_a_placement_restart() -> None:
    svc = service.AgentService(
        engine_url="http://127.0.0.1:9", worker_id="decode-0", registry=prometheus_client.CollectorRegistry()
    )
    svc.healthy, svc.engine_waiting = True, 3
    first = new_placement()
    served = await placement_grpc.build_server(first)
    report = reporter.LoadReporter(
        svc=svc, placement=f"127.0.0.1:{served.port}", pool="decode", address="http://10.0.0.7:8002",
        interval_s=0.0,
    )  # fmt: skip
    try:
        await report.report_once()
        (state,) = first.pool_state().workers
        assert (state.worker.address, state.load.waiting, state.load.healthy) == (
            "http://10.0.0.7:8002",
            3,
            True,
        )
        # The engine beside the agent, at the pod's address: what rebalancing dials to swap weights.
        assert state.worker.engine_address == "http://10.0.0.7:9"
        # Placement restarts on the same port with nothing registered.
        await served.stop(None)
        second = new_placement()
        served = await placement_grpc.build_server(second, port=served.port)
        with pytest.raises(errors.NotFound):
            await report.report_once()
        await report.report_once()
        assert [w.worker.worker_id for w in second.pool_state().workers] == ["decode-0"]
        assert report.reports == 2
    finally:
        await report.aclose()
        await served.stop(None)
        await svc.aclose()


async def test_an_unknown_pool_is_refused_naming_the_field() -> None:
    svc = service.AgentService(
        engine_url="http://127.0.0.1:9", worker_id="w", registry=prometheus_client.CollectorRegistry()
    )
    served = await placement_grpc.build_server(new_placement())
    report = reporter.LoadReporter(
        svc=svc, placement=f"127.0.0.1:{served.port}", pool="prefill", address="http://x:1", interval_s=0.0
    )
    try:
        with pytest.raises(errors.SpecError) as refused:
            await report.report_once()
        assert refused.value.field == "pool" and not report.registered
    finally:
        await report.aclose()
        await served.stop(None)
        await svc.aclose()
