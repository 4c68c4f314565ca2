"""DARTS live on the real data plane: every service a process on 127.0.0.1, the simulated engine
(``fakevllm``) with each candidate's length set by its request id (``--tokens-for``), the buffer and
the DARTS statistics on real Redis.

Step 1 (cold start: standard sampling) gives the statistics their spread and the scheduler its
per-token latency samples; step 2 then saturates every pool (``lambda`` tiny: the budget takes the
cap ``N·M_up``), so each group stops early: its four short candidates are the group and its four
long ones are aborted in the engine (its abort count, its running count back to 0, the agent's
abort counter) with their env sessions closed (open sessions back to 0). The trainer's batch holds
exactly M per group, tokens and logprobs intact. Then the scheduler is killed and restarted: step
3's statistics are the EMA of the saved ones, which only a reload can give.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from treadle import metrics
from treadle.api import v1alpha1
from treadle.localmode import plan as plan_mod
from treadle.localmode import run as run_mod
from treadle.localmode import stack as stack_mod
from treadle.policy.darts import stats
from treadle.services.buffer import client as buffer_client
from treadle.services.scheduler import client as scheduler_client
from treadle.services.scheduler import darts_store
from treadle.testing import redis_server as redis_server_mod
from treadle.testing import scraped
from treadle.v1 import scheduler_pb2

M, GROUPS, SHORT, LONG = 4, 4, 5, 400
STEP1 = (5, 10, 20, 40)  # member i of a step-1 group answers STEP1[i] tokens


def job() -> v1alpha1.RolloutJob:
    return v1alpha1.parse_job({
        "apiVersion": "treadle.dev/v1alpha1", "kind": "RolloutJob", "metadata": {"name": "darts-itest"},
        "spec": {
            "agents": [{"name": "solver", "model": "tiny"}],
            "pools": [{"name": "decode", "agent": "solver", "accelerator": "H20", "replicas": 1}],
            "tasks": [{"name": "math", "agents": ["solver"], "environment": "math-tool", "reward": "math",
                       "groupSize": M, "maxTurns": 1,
                       "sampling": {"mode": "darts", "mUp": 2 * M, "lambda": 1e-6}}],
            "rollout": {"batchSize": 64, "staleness": 8},
        },
    })  # fmt: skip


async def scrape(url: str) -> scraped.Samples:
    async with httpx.AsyncClient(timeout=10) as http:
        return scraped.parse((await http.get(url + "/metrics")).text)


async def saved_after(saved: darts_store.RedisStats, previous: stats.Stats | None) -> stats.Stats:
    """The task's statistics once a step's save replaced ``previous`` (saved in the background)."""
    async with asyncio.timeout(10):
        while (state := await saved.load("math")) == previous or state is None:  # noqa: ASYNC110 - no event
            await asyncio.sleep(0.05)
    return state


async def settle(
    scheduler: scheduler_client.SchedulerClient, *, submitted: int
) -> scheduler_pb2.SchedulerStats:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        stats = await scheduler.stats()
        if stats.submitted == submitted and scheduler_client.settled(stats):
            return stats
        await asyncio.sleep(0.1)
    raise AssertionError(f"not settled in 120s: {await scheduler.stats()}")


async def submit(scheduler: scheduler_client.SchedulerClient, step: int) -> None:
    groups = [scheduler_pb2.PromptGroup(group_id=f"s{step}-g{i}", task="math", seed=i) for i in range(GROUPS)]
    await scheduler.submit(groups)


async def test_darts_aborts_the_surplus_in_the_engines_and_keeps_statistics_across_a_restart(
    stack: stack_mod.Stack, redis_server: redis_server_mod.RedisServer
) -> None:
    tokens_for = (
        *((rf"s1-g\d+-{i}\.", n) for i, n in enumerate(STEP1)),
        (r"s[23]-g\d+-[0-3]\.", SHORT),
        (r"s[23]-g\d+-[4-7]\.", LONG),
    )
    options = plan_mod.Options(
        trajectories=GROUPS * M, max_workers_per_pool=1, env_servers=1, max_tokens=512, engine_step_ms=5.0,
        tokens_for=tokens_for,
    )  # fmt: skip
    plan = plan_mod.make_plan(job(), options)
    services = await run_mod.start_services(stack, plan, options, redis_url=redis_server.url)
    (engine,), (agent,) = services.engines.values(), services.agents.values()
    scheduler = scheduler_client.SchedulerClient(services.scheduler, token=services.token)
    buffer = buffer_client.BufferClient(services.buffer, token=services.token)
    saved = darts_store.RedisStats.from_url(redis_server.url, namespace=plan.job.name)
    try:
        # step 1, cold start: pools of M, every candidate trained
        await submit(scheduler, 1)
        s1 = await settle(scheduler, submitted=GROUPS * M)
        assert (s1.completed, s1.aborted) == (GROUPS * M, 0)
        batch = await buffer.get_batch(batch_size=GROUPS * M, version=0, timeout_s=10)
        assert len(batch.trajectories) == GROUPS * M
        await buffer.ack(batch.batch_id)
        first = await saved_after(saved, None)
        assert set(first.variances) == {f"{i}:" for i in range(GROUPS)}

        # step 2: every pool at M_up = 2M, shortest-only; the four long candidates are aborted
        await submit(scheduler, 2)
        s2 = await settle(scheduler, submitted=GROUPS * (M + 2 * M))
        assert (s2.completed - s1.completed, s2.aborted) == (GROUPS * M, GROUPS * M)
        sched = await scrape(services.metrics["scheduler"].removesuffix("/metrics"))
        assert scraped.value(sched, metrics.SCHED_DARTS_CANDIDATES_TOTAL) == GROUPS * (M + 2 * M)
        assert scraped.value(sched, metrics.SCHED_DARTS_ABORTED_TOTAL, reason="early_stop") == GROUPS * M
        assert scraped.value(sched, metrics.SCHED_DARTS_BUDGET, task="math") == GROUPS * 2 * M
        eng, ag, env = await scrape(engine), await scrape(agent), await scrape(services.envs[0])
        assert scraped.value(eng, metrics.VLLM_REQUEST_SUCCESS, finished_reason="abort") == GROUPS * M
        assert scraped.value(eng, metrics.VLLM_NUM_REQUESTS_RUNNING) == 0
        assert (
            scraped.value(eng, metrics.VLLM_GENERATION_TOKENS) < GROUPS * M * LONG
        )  # the long ones were cut
        assert scraped.value(ag, metrics.AGENT_ABORTS_TOTAL) == GROUPS * M
        assert scraped.value(env, metrics.ENV_SESSIONS_ACTIVE) == 0
        assert scraped.value(env, metrics.ENV_SESSIONS_OPENED_TOTAL) == GROUPS * (M + 2 * M)
        batch = await buffer.get_batch(batch_size=GROUPS * M, version=0, timeout_s=10)
        by_group: dict[str, list[str]] = {}
        for t in batch.trajectories:
            by_group.setdefault(t.group_id, []).append(t.trajectory_id.rsplit("-", 1)[1])
            assert (t.status, t.group_size, len(t.turns)) == ("completed", M, 1)
            turn = t.turns[0]
            assert (
                len(turn.output_token_ids) == SHORT == len(turn.output_logprobs) == len(turn.output_versions)
            )
            assert all(lp < 0 for lp in turn.output_logprobs)
        assert {g: sorted(ms) for g, ms in by_group.items()} == {
            f"s2-g{i}": ["0", "1", "2", "3"] for i in range(4)
        }
        await buffer.ack(batch.batch_id)
        second = await saved_after(saved, first)

        # a restarted scheduler plans from the saved statistics: step 3 blends into them (EMA)
        await scheduler.aclose()
        await stack.restart("scheduler")
        scheduler = scheduler_client.SchedulerClient(services.scheduler, token=services.token)
        await submit(scheduler, 3)
        await settle(scheduler, submitted=GROUPS * M)  # no PTL samples yet after the restart: pools of M
        third = await saved_after(saved, second)
        fresh = 0.0  # step 3's four candidates of each prompt are all SHORT: variance 0
        for key, old in second.variances.items():
            assert third.variances[key] == pytest.approx(0.5 * old + 0.5 * fresh), key
        assert len(third.steps) == len(second.steps) + 1
    finally:
        await scheduler.aclose()
        await buffer.aclose()
        await saved.aclose()
