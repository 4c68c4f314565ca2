"""The real data plane end to end: every service a process on 127.0.0.1 (simulated engine), the
buffer on real Redis, trajectories that carry token ids, logprobs and versions; and an environment
server killed mid-run, after which no trajectory is lost and the stats add up.
"""

from __future__ import annotations

import asyncio
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
from treadle.services.buffer import client as buffer_client
from treadle.services.scheduler import client as scheduler_client
from treadle.testing import redis_server as redis_server_mod
from treadle.v1 import scheduler_pb2


def job(*, max_turns: int, batch_size: int) -> v1alpha1.RolloutJob:
    return v1alpha1.parse_job({
        "apiVersion": "treadle.dev/v1alpha1", "kind": "RolloutJob", "metadata": {"name": "itest"},
        "spec": {
            "agents": [{"name": "solver", "model": "tiny"}],
            "pools": [{"name": "decode", "agent": "solver", "accelerator": "H20", "replicas": 1,
                       "preferredWork": "decode-heavy"}],
            "tasks": [{"name": "math", "agents": ["solver"], "environment": "math-tool", "reward": "math",
                       "affinity": "decode-heavy", "groupSize": 4, "maxTurns": max_turns}],
            "rollout": {"batchSize": batch_size, "staleness": 1},
        },
    })  # fmt: skip


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[stack_mod.Stack]:
    with stack_mod.Stack(tmp_path / "run") as s:
        yield s


async def wait_finished(
    scheduler: scheduler_client.SchedulerClient, *, timeout_s: float
) -> scheduler_pb2.SchedulerStats:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        stats = await scheduler.stats()
        if scheduler_client.settled(stats):
            return stats
        await asyncio.sleep(0.2)
    raise AssertionError(f"not finished in {timeout_s}s: {await scheduler.stats()}")


async def test_trajectories_carry_tokens_logprobs_and_versions(
    stack: stack_mod.Stack, redis_server: redis_server_mod.RedisServer
) -> None:
    options = plan_mod.Options(trajectories=16, max_workers_per_pool=1, env_servers=1, max_tokens=32)
    plan = plan_mod.make_plan(job(max_turns=2, batch_size=8), options)
    services = await run_mod.start_services(stack, plan, options, redis_url=redis_server.url)
    scheduler = scheduler_client.SchedulerClient(services.scheduler, token=services.token)
    buffer = buffer_client.BufferClient(services.buffer, token=services.token)
    try:
        await scheduler.submit(
            [scheduler_pb2.PromptGroup(group_id=g, task=t, seed=s) for g, t, s in plan.groups]
        )
        stats = await wait_finished(scheduler, timeout_s=300)
        assert (stats.submitted, stats.completed) == (16, 16)
        seen = []
        for _ in range(2):
            batch = await buffer.get_batch(batch_size=8, version=0, timeout_s=10)
            for t in batch.trajectories:
                assert t.status == "completed" and t.group_size == 4 and t.prompt.startswith("Compute ")
                assert 1 <= len(t.turns) <= 2
                for turn in t.turns:
                    n = len(turn.output_token_ids)
                    assert n > 0 and len(turn.output_logprobs) == n and len(turn.output_versions) == n
                    assert turn.prompt_token_ids and turn.worker_id == "decode-0"
                    assert all(lp <= 0 for lp in turn.output_logprobs)
                assert (t.min_version, t.max_version) == (0, 0)
                seen.append(t.trajectory_id)
            assert await buffer.ack(batch.batch_id) == len(batch.trajectories)
        assert len(set(seen)) == 16
        assert (await buffer.stats()).stored == 0
        # every service exports its metrics, names from treadle.metrics
        async with httpx.AsyncClient(timeout=10) as http:
            scraped = {name: (await http.get(url)).text for name, url in services.metrics.items()}
        for name in (metrics.SCHED_STAGE_SECONDS, metrics.SCHED_INFLIGHT, metrics.SCHED_REWARD_SECONDS):
            assert name in scraped["scheduler"], name
        completed = f'{metrics.SCHED_TRAJECTORIES_TOTAL}{{status="completed",task="math"}} 16.0'
        assert completed in scraped["scheduler"]
        assert f'{metrics.SCHED_STAGE_SECONDS}_count{{stage="generation"}}' in scraped["scheduler"]
        assert f"{metrics.BUFFER_STALENESS}_count 16.0" in scraped["buffer"]
        assert f'{metrics.PLACEMENT_ASSIGNMENTS_TOTAL}{{pool="decode",reason=' in scraped["placement"]
    finally:
        await scheduler.aclose()
        await buffer.aclose()


async def test_killing_an_env_server_loses_no_trajectory(stack: stack_mod.Stack) -> None:
    options = plan_mod.Options(trajectories=64, max_workers_per_pool=1, env_servers=2, max_tokens=32)
    plan = plan_mod.make_plan(job(max_turns=6, batch_size=64), options)
    services = await run_mod.start_services(stack, plan, options)
    scheduler = scheduler_client.SchedulerClient(services.scheduler, token=services.token)
    buffer = buffer_client.BufferClient(services.buffer, token=services.token)
    try:
        await scheduler.submit(
            [scheduler_pb2.PromptGroup(group_id=g, task=t, seed=s) for g, t, s in plan.groups]
        )
        deadline = time.monotonic() + 60
        while (await scheduler.stats()).turns < 40:  # mid-run: sessions open on both servers
            assert time.monotonic() < deadline, "no progress before the kill"
            await asyncio.sleep(0.1)
        stack.kill("env-0")
        stats = await wait_finished(scheduler, timeout_s=300)
        assert stats.submitted == 64
        assert stats.completed + stats.failed == 64 and stats.aborted == 0
        assert (
            stats.submitted
            == stats.pending + stats.in_flight + stats.unsaved + stats.completed + stats.failed
        )
        # The sessions on env-0 died with it: their trajectories ran again from the start on env-1
        # (scheduler.admission.Admission.restart) and completed; none failed.
        assert stats.env_retries > 0, "the kill hit no trajectory; the test proves nothing"
        assert (stats.completed, stats.failed) == (64, 0), stats.failed_by_reason
        stored = await buffer.stats()
        assert (stored.put, stored.completed, stored.failed) == (64, stats.completed, stats.failed)
        assert sum(stored.failed_by_reason.values()) == stats.failed
    finally:
        await scheduler.aclose()
        await buffer.aclose()
