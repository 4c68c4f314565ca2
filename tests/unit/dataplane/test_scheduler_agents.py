"""The scheduler with a multi-agent task (FlexMARL turn order): per-agent placement, tags and tables.

In-process placement and buffer (memory store), fake env/agents/reward from ``dataplane_fakes``:
each worker's fake agent tags tokens with its own version, so a turn served by the wrong worker shows.
"""

from __future__ import annotations

import asyncio

import dataplane_fakes as fakes
import pytest

from treadle import errors
from treadle.api import jobconfig
from treadle.services.buffer import service as buffer_service
from treadle.services.buffer import store
from treadle.services.placement import protocol as placement_protocol
from treadle.services.placement import service as placement_service
from treadle.services.scheduler import protocol, service
from treadle.v1 import placement_pb2

TASK = jobconfig.TaskConfig(
    name="pe", env="math-tool", agent="planner", agents=("planner", "executor"), group_size=2, max_turns=5
)
VERSIONS = {"p0": 10, "e0": 20, "e1": 21}


def stack(*, steps: int) -> tuple[service.SchedulerService, buffer_service.BufferService]:
    placement = placement_service.PlacementService(
        pools={"plan": "any", "exec": "any"}, tasks={"pe": jobconfig.TaskPlacement()},
        pool_agents={"plan": "planner", "exec": "executor"},
    )  # fmt: skip
    for wid in VERSIONS:
        pool = "plan" if wid.startswith("p") else "exec"
        placement.register_worker(placement_pb2.Worker(worker_id=wid, pool=pool, address=wid))
    agents = {wid: fakes.Agent(version=v) for wid, v in VERSIONS.items()}
    buffer = buffer_service.BufferService(store=store.MemoryStore(), alpha=1, agents=["planner", "executor"])
    svc = service.SchedulerService(
        tasks={"pe": TASK}, settings=jobconfig.Settings(alpha=1, batch_size=8, backoff_s=0.0),
        envs=[fakes.Env(steps=steps)], agent_for=agents.__getitem__,
        placement=placement_service.InProcess(placement), reward=fakes.Reward(), buffer=buffer,
    )  # fmt: skip
    return svc, buffer


async def test_turns_alternate_agents_and_each_table_gets_its_own_turns() -> None:
    svc, buffer = stack(steps=3)
    results = svc.results()
    await svc.submit([protocol.PromptGroup(group_id="g", task="pe", seed=1)])
    async with asyncio.timeout(10):
        done = [await anext(results) for _ in range(2)]
    assert {r.status for r in done} == {"completed"}
    stats = svc.stats()
    assert stats.turns == 6 and dict(stats.turns_by_agent) == {"planner": 4, "executor": 2}
    tables = {}
    for agent in ("planner", "executor"):
        batch = await buffer.get_batch(batch_size=2, version=0, timeout_s=0, agent=agent)
        tables[agent] = {t.trajectory_id: t for t in batch.trajectories}
    assert sorted(tables["planner"]) == ["g-0@planner", "g-1@planner"]
    assert sorted(tables["executor"]) == ["g-0@executor", "g-1@executor"]
    for agent, rows in tables.items():
        for t in rows.values():
            assert t.agent == agent and t.group_id == f"g@{agent}" and t.reward == 1.0
            assert {turn.agent for turn in t.turns} == {agent}
            # the tags are the serving worker's: planner turns on p0 (v10), executor on e0/e1
            for turn in t.turns:
                assert set(turn.output_versions) == {VERSIONS[turn.worker_id]}
                assert turn.worker_id.startswith(agent[0])
            assert (t.min_version, t.max_version) == (
                min(VERSIONS[x.worker_id] for x in t.turns),
                max(VERSIONS[x.worker_id] for x in t.turns),
            )
    # turn order: planner, executor, planner (3 env steps)
    assert (
        len(tables["planner"]["g-0@planner"].turns) == 2
        and len(tables["executor"]["g-0@executor"].turns) == 1
    )
    await svc.aclose()


async def test_an_agent_without_a_turn_still_gets_its_row_so_its_group_completes() -> None:
    svc, buffer = stack(steps=1)  # done after the planner's first turn
    results = svc.results()
    await svc.submit([protocol.PromptGroup(group_id="g", task="pe", seed=1)])
    async with asyncio.timeout(10):
        for _ in range(2):
            await anext(results)
    batch = await buffer.get_batch(batch_size=2, version=0, timeout_s=0, agent="executor")
    assert [len(t.turns) for t in batch.trajectories] == [0, 0]
    assert all(t.status == "completed" for t in batch.trajectories)
    await svc.aclose()


def test_turn_order_and_bad_agent_lists() -> None:
    assert [TASK.agent_of(k) for k in range(5)] == ["planner", "executor", "planner", "executor", "planner"]
    assert jobconfig.TaskConfig(name="m", env="e").agent_of(3) == ""
    with pytest.raises(errors.SpecError) as exc:
        jobconfig.TaskConfig(name="m", env="e", agent="a", agents=("a", "a"))
    assert exc.value.field == "tasks.m.agents"
    with pytest.raises(errors.SpecError) as exc:
        jobconfig.TaskConfig(name="m", env="e", agent="b", agents=("a", "b"))
    assert exc.value.field == "tasks.m.agent"


class WrongAgentPlacement:
    """Answers every assign with the executor worker: the scheduler must not let it serve the planner."""

    def __init__(self) -> None:
        self.released: list[str] = []

    async def assign(self, req: placement_protocol.AssignRequest) -> placement_protocol.Assignment:
        return placement_protocol.Assignment(
            worker_id="e0", address="e0", pool="exec", reason="sticky", work="decode-heavy", agent="executor"
        )

    async def release(self, req: placement_protocol.ReleaseRequest) -> None:
        if req.turn_finished:
            self.released.append(req.worker_id)

    async def place_batch(self, req: placement_protocol.PlaceBatchRequest) -> int:
        return 0


async def test_a_worker_of_another_agent_fails_the_trajectory_and_is_released() -> None:
    placement = WrongAgentPlacement()
    agent = fakes.Agent()
    buffer = buffer_service.BufferService(store=store.MemoryStore(), alpha=1)
    svc = service.SchedulerService(
        tasks={"pe": TASK}, settings=jobconfig.Settings(alpha=1, batch_size=8, backoff_s=0.0),
        envs=[fakes.Env(steps=3)], agent_for=lambda address: agent, placement=placement,
        reward=fakes.Reward(), buffer=buffer,
    )  # fmt: skip
    results = svc.results()
    await svc.submit([protocol.PromptGroup(group_id="g", task="pe", seed=1)])
    async with asyncio.timeout(10):
        done = [await anext(results) for _ in range(2)]
    assert {r.status for r in done} == {"failed"} and agent.started == 0
    assert all("turn 0 of agent 'planner' got worker e0 of agent 'executor'" in r.reason for r in done)
    assert placement.released == ["e0", "e0"]  # the assigned turn does not stay outstanding
    await svc.aclose()
