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
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import httpx
import pytest

from treadle import metrics
from treadle.client import swapper
from treadle.localmode import stack as stack_mod
from treadle.services import podenv
from treadle.services.agent import client as agent_client
from treadle.services.agent import service as agent_service
from treadle.services.placement import client as placement_client
from treadle.services.scheduler import client as scheduler_client
from treadle.trainer import run, toy
from treadle.v1 import placement_pb2, scheduler_pb2

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

    async def until(self, check: Callable[[], Awaitable[bool]], what: str, timeout_s: float = 90.0) -> None:
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
                # Swapped by placement, or (a try that ran out under load) loaded by its agent right after.
                await self.until(lambda w=w, v=v: self.serves(w, v), f"{w} to serve v{v}")  # type: ignore[misc]
        return versions


async def start_workers(stack: stack_mod.Stack, placement: str, *, pool: str, agent: str) -> None:
    """Two inference pods: a SIMULATED engine and an agent that registers itself with ``placement``."""
    for w in WORKERS:
        await start_pod(stack, placement, w, pool=pool, agent=agent)


async def start_pod(stack: stack_mod.Stack, placement: str, worker: str, *, pool: str, agent: str) -> None:
    engine = await stack.start(f"engine-{worker}", "treadle.services.fakevllm", [], kind="http",
                               health_path="/health")  # fmt: skip
    await stack.start(
        f"agent-{worker}", "treadle.services.agent",
        ["--engine-url", engine.url, "--worker-id", worker, "--placement", placement, "--pool", pool,
         "--agent", agent, "--poll-interval-s", "0.1"],
        kind="http",
    )  # fmt: skip


def delete_pod(cluster: Cluster, worker: str) -> None:
    """As ``kubectl delete pod``: its agent and its engine go, and nothing answers at its addresses."""
    for part in ("agent", "engine"):
        cluster.stack.kill(f"{part}-{worker}")


def toy_job(options: run.Options, directory: Path) -> dict[str, str]:
    """The toy RolloutJob (staleness ``options.alpha``) as every service of the stack reads it."""
    return podenv.job_env(run.toy_job(options, directory / "model"), directory)


async def start_placement(stack: stack_mod.Stack, job: dict[str, str]) -> str:
    place = await stack.start("placement", "treadle.services.placement", ["--no-apply-weights"], kind="grpc",
                              env=job)  # fmt: skip
    return place.address


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    with stack_mod.Stack(tmp_path / "run") as stack:
        address = await start_placement(stack, toy_job(run.Options(alpha=ALPHA), tmp_path))
        await start_workers(stack, address, pool=run.POOL, agent=run.AGENT)
        placement = placement_client.PlacementClient(address)
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
    assert [(a.agent, a.target_version) for a in state.agents] == [(run.AGENT, v)]


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


async def test_a_pod_deleted_mid_swap_is_let_go_and_its_replacement_serves_the_version(
    cluster: Cluster,
) -> None:
    """Placement's ``--lost-after-s`` (10 s by default) bounds the swap, not the deadline (300 s): until
    the fix, w1 was tried again until the deadline with the trainer's scheduler suspended throughout."""
    v = await cluster.swap_up(1) + 1
    # Another swap holds w1 paused, so placement's swap of it is under way (retrying) when it dies.
    holder = agent_client.AgentClient(cluster.agent("w1"))
    try:
        await holder.pause("wait")
    finally:
        await holder.aclose()
    cluster.sync.timeout_s = swapper.DEFAULT_TIMEOUT_S
    began = time.monotonic()
    swap = asyncio.create_task(cluster.sync.swap(v))
    await cluster.until(lambda: cluster.serves("w0", v), "w0 to swap")
    assert not swap.done()
    delete_pod(cluster, "w1")
    await asyncio.wait_for(swap, timeout=60)
    took = time.monotonic() - began
    print(f"swap with a pod deleted mid-swap: {took:.1f}s (deadline {swapper.DEFAULT_TIMEOUT_S:.0f}s)")
    assert cluster.sync.last is not None
    assert {w.worker_id: w.outcome for w in cluster.sync.last.workers} == {"w0": "swapped", "w1": "lost"}
    assert took < 30
    assert not (await cluster.workers())["w1"].load.healthy  # no turn goes to a deleted pod
    # The replacement pod (a new name, on its engine's checkpoint) is told the target and loads it.
    placement = cluster.stack.procs["placement"].address
    await start_pod(cluster.stack, placement, "w2", pool=run.POOL, agent=run.AGENT)
    await cluster.until(lambda: cluster.serves("w2", v), "the replacement w2 to serve the version")


async def test_with_every_pod_deleted_a_swap_returns_at_once_and_the_version_is_committable(
    cluster: Cluster,
) -> None:
    """A pool of one replica whose pod is deleted (the dev cluster's learn.yaml): no worker serves the
    version, yet the trainer commits it and resumes the rollout; the replacement loads it at start."""
    v = await cluster.swap_up(1) + 1
    for w in WORKERS:
        delete_pod(cluster, w)

    async def lost() -> bool:
        return not any(w.load.healthy for w in (await cluster.workers()).values())

    await cluster.until(lost, "placement to find both workers silent", timeout_s=30)
    cluster.sync.timeout_s = swapper.DEFAULT_TIMEOUT_S
    began = time.monotonic()
    await asyncio.wait_for(cluster.sync.swap(v), timeout=60)  # no SwapIncomplete: every worker is gone
    assert time.monotonic() - began < 5
    assert cluster.sync.last is not None
    assert {w.worker_id: w.outcome for w in cluster.sync.last.workers} == {"w0": "lost", "w1": "lost"}
    placement = cluster.stack.procs["placement"].address
    await start_pod(cluster.stack, placement, "w2", pool=run.POOL, agent=run.AGENT)
    await cluster.until(lambda: cluster.serves("w2", v), "the replacement w2 to serve the version")


async def test_an_engine_that_restarts_loads_the_version_before_it_takes_turns(cluster: Cluster) -> None:
    v = await cluster.swap_up(ALPHA + 1)  # its checkpoint (version 0) is then beyond the staleness bound
    before = await reloads(cluster, "w1")
    await cluster.stack.restart("engine-w1", health_path="/health")
    # The restarted engine is on its checkpoint (label None) until its agent, polling every 0.1 s, loads
    # the version: by the time the restart's health check returns that may already have happened (CI
    # saw it), so the agent's reload counter, not the label, proves it saw the restart.

    async def reloaded() -> bool:
        return await reloads(cluster, "w1") > before and await cluster.serves("w1", v)

    await cluster.until(reloaded, "w1's restarted engine to load the version")
    assert await reloads(cluster, "w1") == before + 1


async def reloads(cluster: Cluster, worker: str) -> float:
    async with httpx.AsyncClient(timeout=10) as http:
        text = (await http.get(f"{cluster.agent(worker)}/metrics")).text
    line = f'{metrics.AGENT_WEIGHT_RELOADS_TOTAL}{{outcome="loaded"}}'
    return next((float(x.rsplit(" ", 1)[1]) for x in text.splitlines() if x.startswith(line)), 0.0)


async def test_no_trajectory_mixes_versions_beyond_the_staleness_bound(tmp_path: Path) -> None:
    """The rollout runs on while versions are swapped in by placement and committed, RollArt's fence
    (suspend, swap, commit, resume) driven the way a trainer in the job drives it; meanwhile w1 serves
    its checkpoint (version 0, beyond the bound) for a batch and, at a later swap, w1's agent is down
    past the deadline. Every completed trajectory's tokens stay within the bound of the version it was
    initiated at: no turn went to w1 while it served the checkpoint."""
    options = run.Options(engine="simulated", groups_per_step=2, group_size=4, max_tokens=8, alpha=ALPHA)
    with stack_mod.Stack(tmp_path / "run") as stack:
        job = toy_job(options, tmp_path)
        address = await start_placement(stack, job)
        await start_workers(stack, address, pool=run.POOL, agent=run.AGENT)
        env = (await stack.start("env", "treadle.services.env", [], kind="http", env=job)).url
        reward = await stack.start(
            "reward",
            "treadle.services.reward",
            ["--allow-user-module", "treadle.trainer"],
            kind="http",
            env=job,
        )
        buffer = await stack.start("buffer", "treadle.services.buffer", ["--namespace", "weightsync"],
                                   kind="grpc", env=job)  # fmt: skip
        sched = await stack.start(
            "scheduler", "treadle.services.scheduler",
            ["--max-tokens", str(options.max_tokens), "--max-in-flight", "16",
             "--max-concurrent-generations", "16", "--system-prompt", toy.PROMPT,
             "--reward-url", reward.url, "--placement", address, "--buffer", buffer.address,
             "--env-url", env],
            kind="grpc", env=job,
        )  # fmt: skip
        placement = placement_client.PlacementClient(address)
        scheduler = scheduler_client.SchedulerClient(sched.address)
        c = Cluster(stack, placement)
        results: list[scheduler_pb2.TrajectoryResult] = []

        async def collect() -> None:
            async for r in scheduler.results():
                results.append(r)

        async def fence(v: int) -> None:
            await scheduler.suspend()
            try:
                await c.sync.swap(v)
                await scheduler.commit_version(v)
            finally:
                await scheduler.resume()

        async def rollout_until(count: int) -> None:
            deadline = time.monotonic() + 90
            while len(results) < count:
                stats = await scheduler.stats()
                assert time.monotonic() < deadline, f"{len(results)} of {count} trajectories; {stats}"
                await asyncio.sleep(0.1)

        background = [
            asyncio.create_task(collect()),
            asyncio.create_task(run.feed(scheduler, options, interval_s=0.1)),
        ]
        try:
            for w in WORKERS:
                await c.until(lambda w=w: c.serves(w, 0), f"{w} to register")  # type: ignore[misc]
            # Admission lets (alpha + version + 1) * batch trajectories start: each commit lets a batch more.
            await rollout_until(options.batch_size)
            for v in (1, 2):
                await fence(v)
                await rollout_until(len(results) + options.batch_size)
            # Between batches, w1 starts serving its checkpoint (version 0, beyond the bound), as a
            # restarted engine does until its agent loads the target. A swap held on its agent (a
            # move's, say) keeps the agent from loading it and placement's swap from reaching it, while
            # the engine itself generates (resumed behind the agent's back).
            holder = agent_client.AgentClient(c.agent("w1"))
            swap_id = await holder.pause("wait")
            async with httpx.AsyncClient(timeout=10) as http:
                await http.post(f"{c.engine('w1')}/resume")
                await http.post(f"{c.engine('w1')}/update_weight_version", json={"new_version": "0"})

            async def reported_checkpoint() -> bool:
                return (await c.workers())["w1"].load.policy_version == 0

            await c.until(reported_checkpoint, "w1 to report its checkpoint")
            c.sync.timeout_s = 2.0
            await fence(3)  # w0 swaps; w1 is held ("timeout")
            await rollout_until(len(results) + options.batch_size)  # on w0 alone: w1 takes no turn
            await holder.resume(swap_id=swap_id)
            await holder.aclose()
            await c.until(lambda: c.serves("w1", 3), "w1 to load version 3 once the swap is released")
            stack.kill("agent-w1")
            await fence(4)  # w0 alone serves 4; w1 (version 3) is within the bound and comes back
            goal = len(results) + options.batch_size
            await stack.restart("agent-w1")
            await c.until(lambda: c.serves("w1", 4), "w1 to load version 4 by itself")
            await rollout_until(goal)
        finally:
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            await scheduler.aclose()
            await placement.aclose()

    completed = [r for r in results if r.status == "completed"]
    assert len(completed) >= 5 * options.batch_size, [r.reason for r in results if r.status != "completed"][
        :5
    ]
    assert max(r.max_version for r in completed) == 4  # the rollout really ran across the versions
    mixed = [
        (r.trajectory_id, r.init_version, r.min_version, r.max_version)
        for r in completed
        if r.min_version < r.init_version - ALPHA or r.max_version - r.min_version > ALPHA
    ]
    assert not mixed
