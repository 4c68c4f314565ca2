"""The feeder as a process beside a real local stack (every service a process on 127.0.0.1, the
SIMULATED engine, the buffer on real Redis), configured as in a pod (``TREADLE_*`` and job.json):
SIGKILLed mid-epoch and started again, it feeds every row of the epoch once, counted in the buffer.
"""

from __future__ import annotations

import asyncio
import collections
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from treadle import auth
from treadle.api import env_vars, v1alpha1
from treadle.localmode import plan as plan_mod
from treadle.localmode import run as run_mod
from treadle.localmode import stack as stack_mod
from treadle.services.buffer import client as buffer_client
from treadle.services.scheduler import client as scheduler_client
from treadle.testing import redis_server as redis_server_mod

ROOT = Path(__file__).resolve().parents[3]
ROWS, GROUP = 64, 2


def _job() -> v1alpha1.RolloutJob:
    dataset = {"source": {"path": str(ROOT / "manifests/dev/data/math.jsonl")}, "promptColumn": "question",
               "answerColumn": "answer", "idColumn": "id", "shuffleSeed": 3}  # fmt: skip
    return v1alpha1.parse_job({
        "apiVersion": "treadle.dev/v1alpha1", "kind": "RolloutJob", "metadata": {"name": "feedtest"},
        "spec": {
            "feeder": {"volumes": [{"name": "data", "mountPath": str(ROOT / "manifests/dev/data"),
                                    "hostPath": {"path": str(ROOT / "manifests/dev/data")}}]},
            "agents": [{"name": "solver", "model": "tiny"}],
            "pools": [{"name": "decode", "agent": "solver", "accelerator": "H20", "replicas": 1}],
            "tasks": [{"name": "math", "agents": ["solver"], "environment": "math-tool", "reward": "math",
                       "groupSize": GROUP, "maxTurns": 1, "dataset": dataset}],
            # A window far above the dataset: no trainer runs here, so admission never waits on one.
            "rollout": {"batchSize": 512, "staleness": 1},
        },
    })  # fmt: skip


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[stack_mod.Stack]:
    with stack_mod.Stack(tmp_path / "run") as s:
        yield s


async def _feeds(url: str, token: str) -> dict[str, object]:
    async with httpx.AsyncClient(timeout=2.0, headers={auth.HEADER: auth.header_value(token)}) as client:
        body: list[dict[str, object]] = (await client.get(f"{url}/v1/feeds")).json()
    return body[0]


async def _wait(
    url: str, token: str, done: bool, *, fed_at_least: int = 0, timeout_s: float = 180.0
) -> dict[str, object]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        feed = await _feeds(url, token)
        if feed["done"] is done and int(str(feed["fed"])) >= fed_at_least:
            return feed
        await asyncio.sleep(0.02)
    raise AssertionError(
        f"feeder not at done={done}, fed>={fed_at_least} in {timeout_s}s: {await _feeds(url, token)}"
    )


async def test_a_feeder_killed_mid_epoch_resumes_without_repeat_or_gap(
    stack: stack_mod.Stack, redis_server: redis_server_mod.RedisServer, tmp_path: Path
) -> None:
    job = _job()
    options = plan_mod.Options(trajectories=GROUP, max_workers_per_pool=1, env_servers=1, max_tokens=8)
    services = await run_mod.start_services(stack, plan_mod.make_plan(job, options), options,
                                            redis_url=redis_server.url)  # fmt: skip
    config = tmp_path / "job.json"
    config.write_text(json.dumps(job.spec.model_dump(mode="json", by_alias=True, exclude_none=True)))
    env = {
        env_vars.CONFIG: str(config), env_vars.JOB: job.name, env_vars.REDIS_URL: redis_server.url,
        env_vars.SCHEDULER_ADDR: services.scheduler, env_vars.KEY_PREFIX: uuid.uuid4().hex,
        env_vars.TOKEN: services.token,
    }  # fmt: skip
    # Two groups a round (4 trajectories kept pending, admitted at once), a round every 50 ms.
    args = ["--target-pending", "4", "--interval-s", "0.05"]
    feeder = await stack.start("feeder", "treadle.services.feeder", args, kind="http", env=env)
    before = await _wait(feeder.url, services.token, False, fed_at_least=ROWS // 4)
    stack.kill("feeder")
    assert int(str(before["fed"])) < ROWS, before  # killed mid-epoch
    await stack.restart("feeder")
    resumed = await _feeds(feeder.url, services.token)
    assert int(str(resumed["fed"])) >= int(str(before["fed"])), (before, resumed)  # from Redis, not from 0
    await _wait(feeder.url, services.token, True)

    scheduler = scheduler_client.SchedulerClient(services.scheduler, token=services.token)
    buffer = buffer_client.BufferClient(services.buffer, token=services.token)
    try:
        deadline = time.monotonic() + 120
        while not scheduler_client.settled(stats := await scheduler.stats()):
            assert time.monotonic() < deadline, stats
            await asyncio.sleep(0.1)
        assert stats.submitted == ROWS * GROUP  # no group accepted twice
        batch = await buffer.get_batch(batch_size=ROWS * GROUP, version=0, timeout_s=10)
    finally:
        await scheduler.aclose()
        await buffer.aclose()
    per_group = collections.Counter(t.group_id for t in batch.trajectories)
    assert set(per_group) == {f"math:e0:math-{i:03d}" for i in range(ROWS)}  # no row skipped
    assert set(per_group.values()) == {GROUP}  # none repeated
    assert all(t.prompt.startswith("Compute ") and t.status == "completed" for t in batch.trajectories)
    assert "resuming at Position(epoch=0" in stack.procs["feeder"].tail(20_000)
