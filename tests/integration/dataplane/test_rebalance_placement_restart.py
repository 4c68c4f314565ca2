"""A worker moved to another agent stays that agent's when placement restarts and forgets the move.

Real placement (gRPC on 127.0.0.1), a real inference agent registering itself over its reporter,
the SIMULATED engine behind it. The executor's worker ``e0`` is moved to the busy planner through
the rebalancer's HTTP swap; placement then restarts on the same port with nothing registered, and
the agent registers again, in the planner's pool (not the executor pool its ``--pool`` named).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import fastapi
import httpx

from treadle.api import jobconfig
from treadle.services.agent import client as agent_client
from treadle.services.agent import http_app as agent_app
from treadle.services.fakevllm import engine as fake_engine
from treadle.services.fakevllm import http_app as fake_app
from treadle.services.httputil import serve
from treadle.services.placement import grpc_server as placement_grpc
from treadle.services.placement import protocol as placement_protocol
from treadle.services.placement import rebalance
from treadle.services.placement import service as placement_service
from treadle.testing import procs
from treadle.v1 import placement_pb2 as pb

POOLS = {"plan": "decode-heavy", "exec": "decode-heavy"}
AGENTS = {"plan": "planner", "exec": "executor"}


def new_placement() -> placement_service.PlacementService:
    return placement_service.PlacementService(
        pools=POOLS, tasks={"pe": jobconfig.TaskPlacement()}, pool_agents=AGENTS,
        pool_shapes={"plan": "7b", "exec": "7b"}, rebalance_step=1,
    )  # fmt: skip


def register_others(svc: placement_service.PlacementService) -> None:
    """A planner worker and a second executor worker without engines (never moved)."""
    for wid, pool in (("p0", "plan"), ("e1", "exec")):
        svc.register_worker(pb.Worker(worker_id=wid, pool=pool, address=f"http://127.0.0.1:9/{wid}"))


async def wait_for(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 10.0
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


def pool_of(svc: placement_service.PlacementService, worker_id: str) -> str:
    return next((w.worker.pool for w in svc.pool_state().workers if w.worker.worker_id == worker_id), "")


async def test_a_moved_worker_registers_with_the_receiver_after_placement_restarts() -> None:
    first = new_placement()
    register_others(first)
    served = await placement_grpc.build_server(first)
    agent_port = procs.free_port()
    try:
        async with serve.running(fake_app.build_app()) as engine_url:
            app = agent_app.build_app(
                engine_url=engine_url, worker_id="e0", poll_interval_s=0.05,
                placement=f"127.0.0.1:{served.port}", pool="exec", address=f"http://127.0.0.1:{agent_port}",
            )  # fmt: skip
            async with serve.running(app, port=agent_port):
                await wait_for(lambda: pool_of(first, "e0") == "exec", "e0 to register as an executor")
                for i in range(12):  # the planner's queue: 12 turns on its one worker
                    first.assign(
                        placement_protocol.AssignRequest(trajectory_id=f"q{i}", task="pe", agent="planner")
                    )
                # e1 reports a turn running, so e0 (idle, with an engine) is the worker the policy moves.
                first.report_load(pb.WorkerLoad(worker_id="e1", running=1, healthy=True))
                first.report_load(pb.WorkerLoad(worker_id="p0", running=1, healthy=True, policy_version=3))
                loop = rebalance.Rebalancer(first, rebalance.HttpSwapper(timeout_s=10.0), settle_polls=0)
                assert await loop.poll_once() == 1
                assert pool_of(first, "e0") == "plan"
                async with httpx.AsyncClient(timeout=10) as http:
                    label = (await http.get(f"{engine_url}/weight_info")).json()["weight_version"]
                assert label == agent_client.label("planner", 3)

                # Placement restarts on the same port with nothing registered; the agent's next
                # load report is refused (NotFound) and it registers again.
                await served.stop(None)
                second = new_placement()
                served = await placement_grpc.build_server(second, port=served.port)
                await wait_for(lambda: pool_of(second, "e0") != "", "e0 to register again")
                (state,) = [w for w in second.pool_state().workers if w.worker.worker_id == "e0"]
                assert (state.worker.pool, state.agent) == ("plan", "planner")
                assert state.worker.engine_address == engine_url
                # Its turns are the planner's now: a planner turn may go to it, an executor turn may not.
                second.report_load(pb.WorkerLoad(worker_id="e0", healthy=True))
                got = second.assign(
                    placement_protocol.AssignRequest(trajectory_id="t", task="pe", agent="planner")
                )
                assert (got.worker_id, got.agent) == ("e0", "planner")
    finally:
        await served.stop(None)


async def test_a_moved_worker_stays_the_receivers_when_its_agent_container_restarts(tmp_path: Path) -> None:
    """The agent keeps the move in its state file (the pod's emptyDir); a restarted agent trusts it
    only while the engine still shows the label the move left, so an engine that restarted too (and
    serves the rendered checkpoint again) gets the rendered agent and pool back."""
    svc = new_placement()
    served = await placement_grpc.build_server(svc)
    state_file = tmp_path / "agent-state" / "agent.json"
    state_file.parent.mkdir()
    agent_port = procs.free_port()

    def agent(engine_url: str) -> fastapi.FastAPI:
        return agent_app.build_app(
            engine_url=engine_url, worker_id="e0", poll_interval_s=0.05, placement=f"127.0.0.1:{served.port}",
            pool="exec", address=f"http://127.0.0.1:{agent_port}", agent="executor", state_file=state_file,
        )  # fmt: skip

    async def serving(app: fastapi.FastAPI) -> tuple[str, str]:
        async with httpx.AsyncClient(timeout=10) as http:
            load = (await http.get(f"http://127.0.0.1:{agent_port}/v1/load")).json()
        return load["agent"], app.state.reporter.worker.pool

    try:
        async with serve.running(fake_app.build_app()) as engine_url:
            first = agent(engine_url)
            async with serve.running(first, port=agent_port):
                assert await serving(first) == ("executor", "exec")
                moved = pb.Worker(worker_id="e0", pool="plan", address=f"http://127.0.0.1:{agent_port}")
                moved.engine_address = engine_url
                await rebalance.HttpSwapper(timeout_s=10.0).swap(moved, agent="planner", version=3)
                assert await serving(first) == ("planner", "plan")
            restarted = agent(engine_url)  # the same engine, still labelled by the move
            async with serve.running(restarted, port=agent_port):
                assert await serving(restarted) == ("planner", "plan")
                await wait_for(lambda: pool_of(svc, "e0") == "plan", "e0 to register as the planner's")
            # The agent restarts while its engine does not answer yet: it registers only once the
            # engine does, still labelled by the move, and then as the receiver's.
            moved_label = agent_client.label("planner", 3)
            await served.stop(None)  # and a placement that knows nothing, to see when it registers
            svc = new_placement()
            served = await placement_grpc.build_server(svc, port=served.port)
            late_engine_port = procs.free_port()
            waiting = agent(f"http://127.0.0.1:{late_engine_port}")
            async with serve.running(waiting, port=agent_port):
                await asyncio.sleep(0.3)  # several polls of an engine that is not there
                assert pool_of(svc, "e0") == ""
                engine = fake_engine.SimulatedEngine()
                engine.weight_version = moved_label
                async with serve.running(fake_app.build_app(engine=engine), port=late_engine_port):
                    await wait_for(
                        lambda: pool_of(svc, "e0") == "plan", "e0 to register once its engine answers"
                    )
                    assert await serving(waiting) == ("planner", "plan")
        async with serve.running(fake_app.build_app()) as fresh_engine_url:  # the engine restarted too
            rendered = agent(fresh_engine_url)
            async with serve.running(rendered, port=agent_port):
                assert await serving(rendered) == ("executor", "exec")
    finally:
        await served.stop(None)
