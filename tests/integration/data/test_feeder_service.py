"""The feeder over real Redis and the real scheduler service, which runs math-tool (an env server on
127.0.0.1) and scores with the reward gateway (on 127.0.0.1) against each row's answer.

The agent is a stand-in for a trained policy that computes the posed expression: a group scores 1.0
only when the dataset's answer reached the reward as the reference (one row's answer is wrong on
purpose and scores 0.0). Feeders "die" mid-submit (an exception at a chosen point of a chosen
submit; the process-kill test is test_feeder_restart.py) and a fresh feeder resumes from Redis.
"""

from __future__ import annotations

import asyncio
import collections
import json
import re
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import prometheus_client
import pytest
import redis.asyncio as aioredis

from treadle.api import dataset as dataset_api
from treadle.api import jobconfig, v1alpha1
from treadle.services.agent import protocol as agent_protocol
from treadle.services.buffer import service as buffer_service
from treadle.services.buffer import store as buffer_store
from treadle.services.env import client as env_client
from treadle.services.env import http_app as env_app
from treadle.services.env import mathtool
from treadle.services.feeder import service as feeder
from treadle.services.httputil import serve
from treadle.services.placement import service as placement_service
from treadle.services.reward import client as reward_client
from treadle.services.reward import http_app as reward_app
from treadle.services.scheduler import service
from treadle.testing import redis_server as redis_server_mod
from treadle.v1 import placement_pb2, scheduler_pb2

ROOT = Path(__file__).resolve().parents[3]
ROWS = 10
EPOCHS = 2
GROUP = 2
WRONG = "math-003"
"""The row whose answer is rewritten wrong in the test's dataset."""


class Solver:
    """Answers ``<answer>VALUE</answer>`` with the value of the posed expression."""

    async def generate(self, req: agent_protocol.GenerateRequest) -> agent_protocol.GenerateResult:
        found = re.search(r"Compute (.+?)\. You may", req.messages[-1].content)
        assert found is not None, req.messages[-1].content
        value = mathtool.format_number(mathtool.calculate(found.group(1)))
        return agent_protocol.GenerateResult(
            trajectory_id=req.trajectory_id, text=f"<answer>{value}</answer>", prompt_token_ids=[1],
            output_token_ids=[2], output_logprobs=[-0.1], output_versions=[0], finish_reason="stop",
        )  # fmt: skip

    async def abort(self, trajectory_id: str) -> bool:
        return True


class Crash(Exception):
    """The feeder process dying at this point."""


class Scheduler:
    """The in-process scheduler as the feeder sees it; submit number ``crash_at`` dies before the
    scheduler gets the batch, or after it took the batch but before the feeder heard back."""

    def __init__(self, svc: service.SchedulerService, *, crash_at: int = 0, after: bool = False) -> None:
        self.svc, self.crash_at, self.after = svc, crash_at, after
        self.calls: list[list[str]] = []

    async def submit(self, groups: Sequence[scheduler_pb2.PromptGroup]) -> scheduler_pb2.SubmitResponse:
        self.calls.append([g.group_id for g in groups])
        if len(self.calls) == self.crash_at and not self.after:
            raise Crash
        reply = await self.svc.submit(groups)
        if len(self.calls) == self.crash_at:
            raise Crash
        return reply

    async def stats(self) -> scheduler_pb2.SchedulerStats:
        return self.svc.stats()


@pytest.fixture
async def scheduler_svc() -> AsyncIterator[service.SchedulerService]:
    async with (
        serve.running(env_app.build_app(step_timeout_s=5.0)) as env_url,
        serve.running(reward_app.build_app(timeout_s=5.0)) as reward_url,
    ):
        placement = placement_service.PlacementService(
            pools={"decode": "decode-heavy"}, tasks={"math": jobconfig.TaskPlacement("decode-heavy")}
        )
        placement.register_worker(placement_pb2.Worker(worker_id="w0", pool="decode", address="a0"))
        env, reward = env_client.EnvClient(env_url), reward_client.RewardClient(reward_url)
        svc = service.SchedulerService(
            tasks={"math": jobconfig.TaskConfig(name="math", env="math-tool", reward_fn="math",
                                               group_size=GROUP, max_turns=2)},
            settings=jobconfig.Settings(alpha=1, batch_size=1024, max_in_flight=64, backoff_s=0.01),
            envs=[env], agent_for=lambda address: Solver(), placement=placement_service.InProcess(placement),
            reward=reward, buffer=buffer_service.BufferService(store=buffer_store.MemoryStore(), alpha=1),
        )  # fmt: skip
        try:
            yield svc
        finally:
            await svc.aclose()
            await env.aclose()
            await reward.aclose()


@pytest.fixture
async def redis(redis_server: redis_server_mod.RedisServer) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_server.url)
    try:
        yield client
    finally:
        await client.aclose()


def _spec(tmp_path: Path) -> v1alpha1.RolloutJobSpec:
    lines = (ROOT / "manifests/dev/data/math.jsonl").read_text().splitlines()[:ROWS]
    records = [json.loads(line) for line in lines]
    for r in records:
        if r["id"] == WRONG:
            r["answer"] = str(int(r["answer"]) + 1)
    path = tmp_path / "math.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    dataset = {"source": {"path": str(path)}, "promptColumn": "question", "answerColumn": "answer",
               "idColumn": "id", "shuffleSeed": 11, "epochs": EPOCHS}  # fmt: skip
    return v1alpha1.parse_spec({
        "feeder": {"volumes": [{"name": "data", "mountPath": str(tmp_path),
                                "hostPath": {"path": str(tmp_path)}}]},
        "agents": [{"name": "a", "model": "m"}],
        "pools": [{"name": "decode", "agent": "a", "accelerator": "H20"}],
        "tasks": [{"name": "math", "agents": ["a"], "environment": "math-tool", "reward": "math",
                   "groupSize": GROUP, "dataset": dataset}],
    })  # fmt: skip


def _feeder(
    spec: v1alpha1.RolloutJobSpec, redis: aioredis.Redis, namespace: str, scheduler: Scheduler
) -> feeder.FeederService:
    """A fresh feeder, as a new process would build it: rows read again, nothing in memory."""
    datasets = feeder.read_datasets(jobconfig.feeder_config(spec), mount=dataset_api.CONFIG_MAP_MOUNT)
    return feeder.FeederService(
        feeds=feeder.feeds(datasets, client=redis, namespace=namespace), scheduler=scheduler,
        target_pending=4, registry=prometheus_client.CollectorRegistry(),
    )  # fmt: skip


async def _feed_to_the_end(feed: feeder.FeederService) -> None:
    await feed.restore()
    for _ in range(1000):
        if feed.done():
            return
        await feed.tick()
        await asyncio.sleep(0.005)  # trajectories finish meanwhile, so `pending` changes
    raise AssertionError(f"not done after 1000 ticks: {feed.status()}")


async def _settled(svc: service.SchedulerService, *, timeout_s: float = 60.0) -> scheduler_pb2.SchedulerStats:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        stats = svc.stats()
        if stats.completed + stats.failed + stats.aborted == stats.submitted and stats.unsaved == 0:
            return stats
        await asyncio.sleep(0.02)
    raise AssertionError(f"not settled in {timeout_s}s: {svc.stats()}")


async def _take(
    results: AsyncIterator[scheduler_pb2.TrajectoryResult], n: int
) -> list[scheduler_pb2.TrajectoryResult]:
    """The first ``n`` results (every one is stored by the time the scheduler has settled)."""
    out: list[scheduler_pb2.TrajectoryResult] = []
    async with asyncio.timeout(10):
        async for result in results:
            out.append(result)
            if len(out) == n:
                break
    return out


def _check_every_row_once_per_epoch(results: list[scheduler_pb2.TrajectoryResult]) -> None:
    per_group = collections.Counter(r.group_id for r in results)
    want = {f"math:e{e}:math-{i:03d}" for e in range(EPOCHS) for i in range(ROWS)}
    assert set(per_group) == want  # no row skipped in any epoch
    assert set(per_group.values()) == {GROUP}  # and none fed twice (a repeat would add members)
    rewards = {r.group_id.rsplit(":", 1)[1]: r.reward for r in results if r.status == "completed"}
    assert len(rewards) == ROWS and all(r.status == "completed" for r in results)
    assert rewards == {f"math-{i:03d}": 0.0 if f"math-{i:03d}" == WRONG else 1.0 for i in range(ROWS)}


async def test_every_row_is_fed_once_per_epoch_in_the_shuffled_order(
    tmp_path: Path, redis: aioredis.Redis, scheduler_svc: service.SchedulerService
) -> None:
    spec = _spec(tmp_path)
    results = scheduler_svc.results()
    scheduler = Scheduler(scheduler_svc)
    feed = _feeder(spec, redis, uuid.uuid4().hex, scheduler)
    await _feed_to_the_end(feed)
    stats = await _settled(scheduler_svc)
    assert stats.submitted == ROWS * EPOCHS * GROUP
    _check_every_row_once_per_epoch(await _take(results, stats.submitted))
    submitted = [g for call in scheduler.calls for g in call]
    order = feed.feeds[0].shuffle
    ids = [row.row_id for row in feed.feeds[0].rows]
    assert submitted == [f"math:e{e}:{ids[i]}" for e in range(EPOCHS) for i in order.order(e)]
    assert len(scheduler.calls) > 2  # fed in several rounds, as the target allows, not all at once
    done = {"task": "math", "epoch": EPOCHS, "offset": 0, "rows": ROWS, "fed": ROWS * EPOCHS, "done": True}
    assert feed.status() == [done]


@pytest.mark.parametrize("after", [False, True], ids=["before the scheduler got it", "before the ack"])
async def test_a_feeder_dying_mid_submit_neither_repeats_nor_skips(
    tmp_path: Path, redis: aioredis.Redis, scheduler_svc: service.SchedulerService, after: bool
) -> None:
    spec, namespace = _spec(tmp_path), uuid.uuid4().hex
    results = scheduler_svc.results()
    dying = Scheduler(scheduler_svc, crash_at=3, after=after)
    with pytest.raises(Crash):
        await _feed_to_the_end(_feeder(spec, redis, namespace, dying))
    lost = dying.calls[-1]
    resumed = Scheduler(scheduler_svc)
    feed = _feeder(spec, redis, namespace, resumed)
    await _feed_to_the_end(feed)
    assert resumed.calls[0] == lost  # the unacknowledged batch goes again first
    stats = await _settled(scheduler_svc)
    assert stats.submitted == ROWS * EPOCHS * GROUP
    _check_every_row_once_per_epoch(await _take(results, stats.submitted))


async def test_a_task_without_a_dataset_is_fed_its_environments_seeds_and_a_restart_goes_on(
    redis: aioredis.Redis, scheduler_svc: service.SchedulerService
) -> None:
    """math-tool's own problems, seed by seed (``feeding.Seeds``), as a cluster feeds the examples:
    a feeder dying after the scheduler took its third batch, and a fresh one resuming from Redis,
    together feed seeds 0, 1, 2, ... with none skipped and none run twice; every group scores."""
    spec = v1alpha1.parse_spec({
        "agents": [{"name": "a", "model": "m"}],
        "pools": [{"name": "decode", "agent": "a", "accelerator": "H20"}],
        "tasks": [{"name": "math", "agents": ["a"], "environment": "math-tool", "reward": "math",
                   "groupSize": GROUP}],
    })  # fmt: skip
    namespace = uuid.uuid4().hex
    results = scheduler_svc.results()
    dying = Scheduler(scheduler_svc, crash_at=3, after=True)
    feed = _feeder(spec, redis, namespace, dying)
    await feed.restore()
    with pytest.raises(Crash):
        for _ in range(100):
            await feed.tick()
            await asyncio.sleep(0.005)
    resumed = Scheduler(scheduler_svc)
    feed = _feeder(spec, redis, namespace, resumed)
    await feed.restore()
    for _ in range(20):
        await feed.tick()
        await asyncio.sleep(0.005)
    assert resumed.calls[0] == dying.calls[-1]  # the unacknowledged batch goes again first
    fed = sorted({int(g.rsplit(":s", 1)[1]) for call in dying.calls + resumed.calls for g in call})
    assert fed == list(range(len(fed))) and len(fed) > 3 * 2  # seeds 0, 1, 2, ...: none skipped
    stats = await _settled(scheduler_svc)
    assert stats.submitted == len(fed) * GROUP  # the batch sent twice ran once
    done = await _take(results, stats.submitted)
    unsolved = [r for r in done if r.status != "completed" or r.reward != 1.0]
    assert not unsolved, unsolved[:3]
    assert feed.status() == [{"task": "math", "epoch": 0, "offset": len(fed), "rows": 0, "fed": len(fed),
                              "done": False}]  # fmt: skip
