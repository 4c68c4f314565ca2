"""Weight sync in the cluster, on real processes: placement swaps every worker, and workers repair themselves.

Placement (``python -m treadle.services.placement`` with a staleness bound) and two inference pods
(each a SIMULATED engine, ``treadle.services.fakevllm``, and an inference agent that registers
itself with placement, as the operator renders it), all on 127.0.0.1. The trainer's side is the
SDK's ``ClusterSwapper`` over placement's client. The simulated engine loads no weights: placement
runs with ``--no-apply-weights``, so a swap moves the engine's weight-version label, through the
same pause / relabel / resume sequence and the same agents as with real vLLM (the weights
themselves: tests/slow). Each test starts its own stack.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import httpx
import pytest

from treadle import metrics
from treadle.client import swapper
from treadle.localmode import stack as stack_mod
from treadle.services.agent import client as agent_client
from treadle.services.agent import service as agent_service
from treadle.services.placement import client as placement_client
from treadle.v1 import placement_pb2

WORKERS = ("w0", "w1")
ALPHA = 1
pytestmark = pytest.mark.timeout(300)


class Cluster:
    def __init__(self, stack: stack_mod.Stack, placement: placement_client.PlacementClient) -> None:
        self.stack = stack
        self.placement = placement
        self.sync = swapper.ClusterSwapper(placement, timeout_s=30.0)

    def engine(self, worker: str) -> str:
        return self.stack.procs[f"engine-{worker}"].url

    def agent(self, worker: str) -> str:
        return self.stack.procs[f"agent-{worker}"].url

    async def label(self, worker: str) -> str | None:
        async with httpx.AsyncClient(timeout=10) as http:
            return (await http.get(f"{self.engine(worker)}/weight_info")).json()["weight_version"]  # type: ignore[no-any-return]

    async def paused(self, worker: str) -> bool:
        async with httpx.AsyncClient(timeout=10) as http:
            return bool((await http.get(f"{self.engine(worker)}/is_paused")).json()["is_paused"])

    async def workers(self) -> dict[str, placement_pb2.WorkerState]:
        return {w.worker.worker_id: w for w in (await self.placement.pool_state()).workers}

    async def until(self, check: Callable[[], Awaitable[bool]], what: str, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not await check():
            logs = "\n".join(f"--- {n}\n{p.tail(1500)}" for n, p in self.stack.procs.items())
            assert time.monotonic() < deadline, f"timed out waiting for {what}\n{logs}"
            await asyncio.sleep(0.1)

    async def serves(self, worker: str, version: int) -> bool:
        """The engine is labelled ``version``, generating, and placement would give it turns."""
        state = (await self.workers()).get(worker)
        healthy = state is not None and state.load.healthy and state.load.policy_version == version
        labelled = agent_service.parse_version(await self.label(worker)) == version
        return healthy and labelled and not await self.paused(worker)

    async def restart_agent(self, worker: str) -> None:
        await self.stack.restart(f"agent-{worker}")

    async def swap_up(self, versions: int) -> int:
        """Swap every worker to 1, 2, ... ``versions``; returns the last."""
        for v in range(1, versions + 1):
            await self.sync.swap(v)
            for w in WORKERS:
                assert await self.serves(w, v)
        return versions


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    with stack_mod.Stack(tmp_path / "run") as stack:
        place = await stack.start(
            "placement", "treadle.services.placement",
            ["--pools", json.dumps({"pool": "decode-heavy"}), "--tasks", json.dumps({"math": {}}),
             "--pool-agents", json.dumps({"pool": "policy"}), "--staleness", str(ALPHA),
             "--no-apply-weights"],
            kind="grpc",
        )  # fmt: skip
        for w in WORKERS:
            engine = await stack.start(f"engine-{w}", "treadle.services.fakevllm", [], kind="http",
                                       health_path="/health")  # fmt: skip
            await stack.start(
                f"agent-{w}", "treadle.services.agent",
                ["--engine-url", engine.url, "--worker-id", w, "--placement", place.address, "--pool", "pool",
                 "--agent", "policy", "--poll-interval-s", "0.1"],
                kind="http",
            )  # fmt: skip
        placement = placement_client.PlacementClient(place.address)
        c = Cluster(stack, placement)
        try:
            for w in WORKERS:
                await c.until(lambda w=w: c.serves(w, 0), f"{w} to register")  # type: ignore[misc]
            yield c
        finally:
            await placement.aclose()


async def test_a_swap_reaches_every_worker(cluster: Cluster) -> None:
    v = 1
    await cluster.sync.prefetch(v)
    await cluster.sync.swap(v)
    assert cluster.sync.last is not None
    assert {w.worker_id: w.outcome for w in cluster.sync.last.workers} == {"w0": "swapped", "w1": "swapped"}
    for w in WORKERS:
        assert await cluster.serves(w, v)
    state = await cluster.placement.pool_state()
    assert [(a.agent, a.target_version) for a in state.agents] == [("policy", v)]


async def test_a_worker_whose_agent_restarts_mid_swap_comes_back_on_the_version(cluster: Cluster) -> None:
    v = await cluster.swap_up(1)
    # Another swap (a rebalancing move's, say) holds w1 paused: placement's swap of it waits.
    holder = agent_client.AgentClient(cluster.agent("w1"))
    try:
        await holder.pause("wait")
    finally:
        await holder.aclose()
    swap = asyncio.create_task(cluster.sync.swap(v))
    await cluster.until(lambda: cluster.serves("w0", v), "w0 to swap")
    assert await cluster.paused("w1") and not swap.done()
    # w1's agent dies holding the pause and comes back: its engine is still paused by a swap no
    # one will resume. Placement keeps trying w1 until its deadline; the new agent lets it through.
    await cluster.restart_agent("w1")
    await asyncio.wait_for(swap, timeout=60)
    assert cluster.sync.last is not None
    assert {w.worker_id: w.outcome for w in cluster.sync.last.workers} == {"w0": "swapped", "w1": "swapped"}
    await cluster.until(lambda: cluster.serves("w1", v), "w1 to serve the version, unpaused")


async def test_a_worker_down_past_the_deadline_loads_the_version_when_it_is_back(cluster: Cluster) -> None:
    v = await cluster.swap_up(1) + 1
    cluster.stack.kill("agent-w1")
    cluster.sync.timeout_s = 2.0
    await cluster.sync.swap(v)  # w0 swaps, so the version is committed-worthy; w1 misses it
    assert cluster.sync.last is not None
    outcomes = {w.worker_id: w.outcome for w in cluster.sync.last.workers}
    assert outcomes == {"w0": "swapped", "w1": "timeout"}  # its agent unreachable: tried until the deadline
    assert await cluster.label("w1") == str(v - 1)
    await cluster.restart_agent("w1")
    # Registered again, it is told the target in the answer to its load report and loads it itself.
    await cluster.until(lambda: cluster.serves("w1", v), "w1 to load the version by itself")
    assert await reloads(cluster, "w1") == 1


async def test_an_engine_that_restarts_loads_the_version_before_it_takes_turns(cluster: Cluster) -> None:
    v = await cluster.swap_up(ALPHA + 1)  # its checkpoint (version 0) is then beyond the staleness bound
    before = await reloads(cluster, "w1")
    await cluster.stack.restart("engine-w1", health_path="/health")
    assert await cluster.label("w1") is None  # the checkpoint again: nothing loaded
    await cluster.until(lambda: cluster.serves("w1", v), "w1's restarted engine to load the version")
    assert await reloads(cluster, "w1") == before + 1


async def reloads(cluster: Cluster, worker: str) -> float:
    async with httpx.AsyncClient(timeout=10) as http:
        text = (await http.get(f"{cluster.agent(worker)}/metrics")).text
    line = f'{metrics.AGENT_WEIGHT_RELOADS_TOTAL}{{outcome="loaded"}}'
    return next((float(x.rsplit(" ", 1)[1]) for x in text.splitlines() if x.startswith(line)), 0.0)
