"""A two-agent job (FlexMARL) on the real services, every one a process on 127.0.0.1 (SIMULATED
engine, memory buffer), with a skewed workload that makes placement move workers between agents.

The planner starts with one worker and the executor with three, and both act in turn, so the
planner's queue builds and placement's rebalancer moves executor workers to it (drain, weight
swap through the agent and engine, re-register). The engines' weight-version labels stand in for
the trainer: planner weights are at version 3, executor weights at 5, so a turn tagged with the
wrong agent's weights shows in its version tags.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from treadle import metrics
from treadle.api import v1alpha1
from treadle.localmode import plan as plan_mod
from treadle.localmode import run as run_mod
from treadle.localmode import stack as stack_mod
from treadle.services.agent import client as agent_client
from treadle.services.buffer import client as buffer_client
from treadle.services.placement import client as placement_client
from treadle.services.scheduler import client as scheduler_client
from treadle.v1 import common_pb2, scheduler_pb2

VERSION = {"planner": 3, "executor": 5}
ORDER = ("planner", "executor")


def job() -> v1alpha1.RolloutJob:
    agent = {"model": "Qwen/Qwen2.5-7B-Instruct"}
    return v1alpha1.parse_job({
        "apiVersion": "treadle.dev/v1alpha1", "kind": "RolloutJob", "metadata": {"name": "marl"},
        "spec": {
            "agents": [{"name": "planner", **agent}, {"name": "executor", **agent}],
            "pools": [
                {"name": "plan", "agent": "planner", "accelerator": "H20", "replicas": 1},
                {"name": "exec", "agent": "executor", "accelerator": "H20", "replicas": 3},
            ],
            "tasks": [{"name": "pe", "agents": list(ORDER), "environment": "math-tool", "reward": "math",
                       "groupSize": 4, "maxTurns": 6}],
            "rollout": {"batchSize": 8, "staleness": 8},
        },
    })  # fmt: skip


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[stack_mod.Stack]:
    with stack_mod.Stack(tmp_path / "run") as s:
        yield s


async def test_two_agents_take_turns_and_a_busy_agent_receives_workers(stack: stack_mod.Stack) -> None:
    options = plan_mod.Options(
        trajectories=48,
        max_workers_per_pool=3,
        env_servers=1,
        max_tokens=24,
        max_num_seqs=2,
        engine_step_ms=2,
        rebalance_interval_s=0.2,
    )
    plan = plan_mod.make_plan(job(), options)
    services = await run_mod.start_services(stack, plan, options, report_interval_s=0.1)
    home = {w.worker_id: ("planner" if w.pool == "plan" else "executor") for w in plan.workers}
    async with httpx.AsyncClient(timeout=10) as http:
        for wid, url in services.engines.items():  # the trainer's part: each agent's weights loaded
            label = agent_client.label(home[wid], VERSION[home[wid]])
            await http.post(url + "/update_weight_version", json={"new_version": label})
    assert services.reporter is not None
    reporter = services.reporter
    scheduler = scheduler_client.SchedulerClient(services.scheduler, token=services.token)
    buffer = buffer_client.BufferClient(services.buffer, token=services.token)
    placement = placement_client.PlacementClient(services.placement, token=services.token)
    try:
        deadline = time.monotonic() + 30
        while {a.weight_version for a in (await placement.pool_state()).agents} != set(VERSION.values()):
            assert time.monotonic() < deadline, "the workers' versions never reached placement"
            await asyncio.sleep(0.1)
        await scheduler.submit(
            [scheduler_pb2.PromptGroup(group_id=g, task=t, seed=s) for g, t, s in plan.groups]
        )
        deadline = time.monotonic() + 240
        while True:
            stats = await scheduler.stats()
            if scheduler_client.settled(stats):
                break
            assert time.monotonic() < deadline, f"not finished: {stats}"
            await asyncio.sleep(0.2)
        assert stats.submitted == 48 and stats.completed == 48, stats
        pools = await placement.pool_state()
        # -- at least one rebalance, counted, visible per worker and agent, and the floor held
        assert pools.rebalance_moves >= 1
        assert {a.agent: a.moved_in for a in pools.agents}["planner"] >= 1
        assert all(a.instances >= 1 for a in pools.agents)
        now = {w.worker.worker_id: w.agent for w in pools.workers}
        assert all(not w.moving_to for w in pools.workers)
        async with httpx.AsyncClient(timeout=10) as http:
            scraped = (await http.get(services.metrics["placement"])).text
            labels = {
                wid: (await http.get(url + "/weight_info")).json()["weight_version"]
                for wid, url in services.engines.items()
            }
        assert f'{metrics.PLACEMENT_REBALANCE_MOVES_TOTAL}{{donor="executor",receiver="planner"}}' in scraped
        # every engine carries the weights of the agent it serves now
        assert labels == {wid: agent_client.label(agent, VERSION[agent]) for wid, agent in now.items()}
        # -- each agent's table holds every trajectory once, with that agent's turns only
        rows: dict[str, dict[str, common_pb2.Trajectory]] = {}
        for agent in ORDER:
            batch = await buffer.get_batch(batch_size=48, version=0, timeout_s=10, agent=agent)
            rows[agent] = {t.trajectory_id.rsplit("@", 1)[0]: t for t in batch.trajectories}
            assert len(rows[agent]) == 48
            assert all(t.trajectory_id.endswith(f"@{agent}") and t.agent == agent for t in batch.trajectories)
        moved_served: set[str] = set()
        for tid, planner_row in rows["planner"].items():
            turns = [*planner_row.turns, *rows["executor"][tid].turns]
            # the context grows every turn: sorting by prompt length restores the trajectory's order
            turns.sort(key=lambda x: len(x.prompt_token_ids))
            assert [x.agent for x in turns] == [ORDER[k % 2] for k in range(len(turns))], tid
            assert planner_row.reward == rows["executor"][tid].reward
            for x in turns:
                # the tokens carry the version of the weights of the turn's agent: never the other's
                assert set(x.output_versions) == {VERSION[x.agent]}, (tid, x.worker_id, x.agent)
                if home[x.worker_id] != x.agent:  # only a moved worker can have served another agent
                    moved_served.add(x.worker_id)
        assert moved_served, "no moved worker served its new agent: the move proves nothing"
        stored = await buffer.stats()
        assert stored.put == 96 and stored.completed == 96
    finally:
        reporter.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reporter
        await scheduler.aclose()
        await buffer.aclose()
        await placement.aclose()
