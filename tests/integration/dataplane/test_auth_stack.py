"""Authenticated internals on real processes: every gRPC and HTTP service of a job (local mode's stack,
each a process on 127.0.0.1, plus the feeder) refuses a call without the job's token and a call with
another job's token, answers its health checks and ``/metrics`` to anyone, and a refused call changes
nothing: a forged ``CommitVersion`` of a huge version leaves the policy version where it was, a forged
buffer ``Put`` stores nothing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from treadle import auth, errors
from treadle.api import env_vars, v1alpha1
from treadle.localmode import plan as plan_mod
from treadle.localmode import run as run_mod
from treadle.localmode import stack as stack_mod
from treadle.services.buffer import client as buffer_client
from treadle.services.grpcutil import server as grpcutil_server
from treadle.services.placement import client as placement_client
from treadle.services.scheduler import client as scheduler_client
from treadle.testing import redis_server as redis_server_mod
from treadle.v1 import common_pb2, placement_pb2, scheduler_pb2

ROOT = Path(__file__).resolve().parents[3]
OTHER_JOB = auth.new_token()
"""Another job's token: a different job's Secret holds a different one."""


def _job() -> v1alpha1.RolloutJob:
    dataset = {"source": {"path": str(ROOT / "manifests/dev/data/math.jsonl")}, "promptColumn": "question",
               "answerColumn": "answer", "idColumn": "id"}  # fmt: skip
    return v1alpha1.parse_job({
        "apiVersion": "treadle.dev/v1alpha1", "kind": "RolloutJob", "metadata": {"name": "authtest"},
        "spec": {
            "feeder": {"volumes": [{"name": "data", "mountPath": str(ROOT / "manifests/dev/data"),
                                    "hostPath": {"path": str(ROOT / "manifests/dev/data")}}]},
            "agents": [{"name": "solver", "model": "tiny"}],
            "pools": [{"name": "decode", "agent": "solver", "accelerator": "H20", "replicas": 1}],
            "tasks": [{"name": "math", "agents": ["solver"], "environment": "math-tool", "reward": "math",
                       "groupSize": 2, "maxTurns": 1, "dataset": dataset}],
            "rollout": {"batchSize": 4, "staleness": 1},
        },
    })  # fmt: skip


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[stack_mod.Stack]:
    with stack_mod.Stack(tmp_path / "run") as s:
        yield s


@pytest.fixture
async def running(
    stack: stack_mod.Stack, redis_server: redis_server_mod.RedisServer
) -> tuple[run_mod.Services, str]:
    """The job's services (no prompt submitted: nothing runs unless a caller gets in) and its feeder."""
    options = plan_mod.Options(trajectories=2, max_workers_per_pool=1, env_servers=1, max_tokens=8)
    plan = plan_mod.make_plan(_job(), options)
    services = await run_mod.start_services(stack, plan, options, redis_url=redis_server.url)
    env = run_mod.job_env(stack, plan, services.token)
    env |= {env_vars.REDIS_URL: redis_server.url, env_vars.SCHEDULER_ADDR: services.scheduler,
            env_vars.KEY_PREFIX: f"authtest-{time.monotonic_ns()}"}  # fmt: skip
    # The feeder feeds nothing: a target of 0 pending prompts keeps the scheduler empty.
    feeder = await stack.start("feeder", "treadle.services.feeder", ["--target-pending", "0"], kind="http",
                               env=env)  # fmt: skip
    return services, feeder.url


@dataclasses.dataclass
class Clients:
    scheduler: scheduler_client.SchedulerClient
    placement: placement_client.PlacementClient
    buffer: buffer_client.BufferClient

    @classmethod
    @contextlib.asynccontextmanager
    async def of(cls, services: run_mod.Services, token: str | None) -> AsyncIterator[Clients]:
        clients = cls(
            scheduler_client.SchedulerClient(services.scheduler, token=token),
            placement_client.PlacementClient(services.placement, token=token),
            buffer_client.BufferClient(services.buffer, token=token),
        )
        try:
            yield clients
        finally:
            for c in (clients.scheduler, clients.placement, clients.buffer):
                await c.aclose()


FORGED = common_pb2.Trajectory(trajectory_id="forged-0", group_id="forged", task="math", status="completed",
                               reward=1.0)  # fmt: skip
GRPC_CALLS: dict[str, Callable[[Clients], Awaitable[Any]]] = {
    "Scheduler/CommitVersion": lambda c: c.scheduler.commit_version(1_000_000_000),
    "Scheduler/Suspend": lambda c: c.scheduler.suspend(),
    "Scheduler/Resume": lambda c: c.scheduler.resume(),
    "Scheduler/Submit": lambda c: c.scheduler.submit(
        [scheduler_pb2.PromptGroup(group_id="forged", task="math")]
    ),
    "Scheduler/Stats": lambda c: c.scheduler.stats(),
    "Placement/RegisterWorker": lambda c: c.placement.register_worker(
        placement_pb2.Worker(worker_id="forged", pool="decode", address="http://127.0.0.1:9")
    ),
    "Placement/SwapWeights": lambda c: c.placement.swap_weights(1_000_000_000, timeout_s=5.0),
    "Placement/PoolState": lambda c: c.placement.pool_state(),
    "Buffer/Put": lambda c: c.buffer.put([FORGED]),
    "Buffer/GetBatch": lambda c: c.buffer.get_batch(batch_size=1, version=0, timeout_s=0.1),
    "Buffer/Stats": lambda c: c.buffer.stats(),
    # Server-streaming methods: refused before the first message.
    "Scheduler/StreamResults": lambda c: anext(aiter(c.scheduler.results())),
    "Buffer/StreamBatch": lambda c: anext(
        aiter(c.buffer.stream_batch(batch_size=2, micro_batch_size=1, version=0, timeout_s=0.1))
    ),
}  # fmt: skip


async def test_grpc_calls_without_the_jobs_token_are_refused_and_change_nothing(
    running: tuple[run_mod.Services, str],
) -> None:
    services, _ = running
    for token in (None, OTHER_JOB):
        async with Clients.of(services, token) as forger:
            for method, call in GRPC_CALLS.items():
                with pytest.raises(errors.Unauthenticated, match="authorization") as refused:
                    await call(forger)
                assert method in str(refused.value), (token, method)  # the message names the method
    async with Clients.of(services, services.token) as job:
        stats = await job.scheduler.stats()
        assert (stats.version, stats.submitted, stats.suspended) == (0, 0, False)
        assert (await job.buffer.stats()).put == 0
        assert "forged" not in {w.worker.worker_id for w in (await job.placement.pool_state()).workers}
    for address in (services.scheduler, services.placement, services.buffer):
        assert await grpcutil_server.check_health(address)  # no token: the kubelet's probe


def _http_calls(services: run_mod.Services, feeder: str) -> dict[str, tuple[str, str, dict[str, Any] | None]]:
    (agent,) = services.agents.values()
    env = services.envs[0]
    return {
        "env open": ("POST", f"{env}/v1/sessions", {"env": "math-tool", "session_id": "x", "seed": 0}),
        "env step": ("POST", f"{env}/v1/sessions/x/step", {"action": "1", "step": 0}),
        "env stats": ("GET", f"{env}/v1/stats", None),
        "reward score": ("POST", f"{services.reward}/v1/score", {"trajectory_id": "x", "fn": "math"}),
        "agent generate": ("POST", f"{agent}/v1/generate", {"request_id": "x"}),
        "agent pause": ("POST", f"{agent}/v1/pause", {}),
        "agent resume": ("POST", f"{agent}/v1/resume", {}),
        "agent abort": ("POST", f"{agent}/v1/abort", {"trajectory_id": "x"}),
        "agent load": ("GET", f"{agent}/v1/load", None),
        "feeder feeds": ("GET", f"{feeder}/v1/feeds", None),
    }  # fmt: skip


async def test_http_calls_without_the_jobs_token_are_refused(running: tuple[run_mod.Services, str]) -> None:
    services, feeder = running
    for token in (None, OTHER_JOB):
        headers = {} if token is None else {auth.HEADER: auth.header_value(token)}
        async with httpx.AsyncClient(timeout=10.0, headers=headers) as http:
            for name, (method, url, body) in _http_calls(services, feeder).items():
                reply = await http.request(method, url, json=body)
                assert reply.status_code == 401, (token, name, reply.status_code, reply.text)
                error = reply.json()["error"]
                assert error["type"] == "AuthenticationError" and "authorization" in error["message"], name
                assert reply.headers["www-authenticate"] == "Bearer", name
    # Open to anyone: the kubelet's probes and Prometheus's scrapes.
    (agent,) = services.agents.values()
    servers = [services.envs[0], services.reward, agent, feeder]
    async with httpx.AsyncClient(timeout=10.0) as http:
        for base in servers:
            for path in ("/healthz", "/metrics"):
                reply = await http.get(base + path)
                assert reply.status_code == 200, (base, path, reply.text)
    headers = {auth.HEADER: auth.header_value(services.token)}
    async with httpx.AsyncClient(timeout=10.0, headers=headers) as http:
        for url in (f"{services.envs[0]}/v1/stats", f"{services.reward}/v1/functions", f"{agent}/v1/load",
                    f"{feeder}/v1/feeds"):  # fmt: skip
            assert (await http.get(url)).status_code == 200, url
