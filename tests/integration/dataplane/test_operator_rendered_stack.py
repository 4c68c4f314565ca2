"""The operator's output runs: the children rendered for ``math-tool-h20.yaml`` started as processes.

Each service container's command and environment are taken verbatim from the pure renderers, the
ConfigMap's files are written to a directory standing in for ``/etc/treadle``, and only what a
cluster provides is rewritten: in-cluster addresses become free 127.0.0.1 ports, ``0.0.0.0``
becomes 127.0.0.1, and ``python`` this interpreter. The vLLM container is replaced by the
SIMULATED engine on the port the agent is told about. Trajectories must land in the real Redis
under the job's key prefix, and the agent must have registered itself with placement. A two-agent
job, rendered and run the same way, must move a worker between agents (inter-agent rebalancing).
"""

from __future__ import annotations

import asyncio
import collections
import json
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis
import rendered_pods
import yaml

from treadle import auth, errors
from treadle.api import dataset as dataset_api
from treadle.api import env_vars, v1alpha1
from treadle.localmode import stack as stack_mod
from treadle.operator import config, render
from treadle.operator.render import common as render_common
from treadle.operator.render import pool as render_pool
from treadle.services.agent import client as agent_client
from treadle.services.buffer import client as buffer_client
from treadle.services.placement import client as placement_client
from treadle.services.scheduler import client as scheduler_client
from treadle.testing import mooncake_master as mooncake_master_mod
from treadle.testing import procs
from treadle.testing import redis_server as redis_server_mod
from treadle.v1 import scheduler_pb2
from treadle.weights import mooncake_client

EXAMPLE = Path(__file__).parents[3] / "manifests" / "examples" / "math-tool-h20.yaml"
NAMESPACE = "team-a"
GROUPS = 2


def rendered() -> tuple[v1alpha1.RolloutJob, list[dict[str, Any]]]:
    raw = yaml.safe_load(EXAMPLE.read_text())
    raw["metadata"]["namespace"] = NAMESPACE
    job = v1alpha1.parse_job(raw)
    return job, render.render_children(job, config.OperatorConfig(redis_url="redis://placeholder"))


async def test_rendered_children_run_and_fill_the_buffer(
    tmp_path: Path, redis_server: redis_server_mod.RedisServer
) -> None:
    job, children = rendered()
    config_dir = rendered_pods.mount_configmap(children, tmp_path)
    rw = rendered_pods.Rewriter(job, config_dir=config_dir, redis_url=redis_server.url)
    by_name = rendered_pods.containers(children)
    prefix = f"{NAMESPACE}/{job.name}"
    redis = aioredis.Redis.from_url(redis_server.url, protocol=2)
    await redis.delete(*[k async for k in redis.scan_iter(f"treadle:buf:{{{prefix}}}:*")] or ["-"])

    with stack_mod.Stack(tmp_path / "run") as stack:
        agent_port, sched_port = await rendered_pods.launch_rendered(stack, rw, by_name, tmp_path)

        placement = placement_client.PlacementClient(f"127.0.0.1:{rw.ports['placement']}", token=rw.token)
        scheduler = scheduler_client.SchedulerClient(f"127.0.0.1:{sched_port}", token=rw.token)
        try:
            # The agent registers itself from TREADLE_POOL and reports its load.
            deadline = time.monotonic() + 30
            while not (await placement.pool_state()).workers:
                assert time.monotonic() < deadline, stack.procs["agent"].tail()
                await asyncio.sleep(0.1)
            state = (await placement.pool_state()).workers[0]
            assert state.worker.pool == "decode" and state.worker.address == f"http://127.0.0.1:{agent_port}"
            while not state.load.healthy:  # the first report follows the agent's first engine poll
                assert time.monotonic() < deadline, stack.procs["agent"].tail()
                await asyncio.sleep(0.1)
                state = (await placement.pool_state()).workers[0]

            task = job.spec.tasks[0]
            await scheduler.submit(
                [scheduler_pb2.PromptGroup(group_id=f"g{i}", task=task.name, seed=i) for i in range(GROUPS)]
            )
            deadline = time.monotonic() + 120
            while True:
                stats = await scheduler.stats()
                if scheduler_client.settled(stats):
                    break
                assert time.monotonic() < deadline, f"{stats}\n{stack.procs['scheduler'].tail()}"
                await asyncio.sleep(0.2)
            # Started from the rendered objects, they refuse whoever lacks the job's Secret.
            anyone = scheduler_client.SchedulerClient(f"127.0.0.1:{sched_port}")
            with pytest.raises(errors.Unauthenticated):
                await anyone.commit_version(1_000_000_000)
            await anyone.aclose()
            async with httpx.AsyncClient(timeout=10) as http:
                for name, path in (("agent", "/v1/pause"), ("env", "/v1/sessions"), ("reward", "/v1/score")):
                    reply = await http.post(f"http://127.0.0.1:{rw.ports[name]}{path}", json={})
                    assert reply.status_code == 401, (name, reply.text)
        finally:
            await placement.aclose()
            await scheduler.aclose()

        members = task.group_size + int(task.redundancy * task.group_size + 0.999999)
        assert stats.submitted == GROUPS * members
        assert stats.completed == stats.submitted, dict(stats.failed_by_reason)
        stored = [k async for k in redis.scan_iter(f"treadle:buf:{{{prefix}}}:t:*")]
        assert len(stored) == GROUPS * members
        # Settings came from the job (staleness, batch size) through the ConfigMap, and only there.
        sched_env = rw.env(by_name["scheduler"])
        assert set(sched_env) <= env_vars.RENDERED
        spec = json.loads((config_dir / "job.json").read_text())
        assert spec["rollout"]["batchSize"] == job.spec.rollout.batch_size
        # Every process serves its own metrics on the port its pod names "metrics".
        assert set(rw.metrics) == {"buffer", "placement", "env", "reward", "agent", "scheduler"}
        async with httpx.AsyncClient(timeout=5) as http:
            for name, port in rw.metrics.items():
                body = (await http.get(f"http://127.0.0.1:{port}/metrics")).text
                assert f"treadle_{name}_" in body, (name, body[:500])
    await redis.aclose()


ROWS = 16
USER_ENV = "py:treadle.services.env.examples:SingleTurn"


def dataset_job() -> v1alpha1.RolloutJob:
    """``math-tool-h20.yaml`` with prompts from the rows of a ConfigMap, served by a user environment."""
    raw = yaml.safe_load(EXAMPLE.read_text())
    raw["metadata"]["namespace"] = NAMESPACE
    raw["spec"]["tasks"][0] |= {
        "environment": USER_ENV, "groupSize": 2, "redundancy": 0, "maxTurns": 1,
        "dataset": {"source": {"configMap": {"name": "math-rows", "key": "math.jsonl"}},
                    "promptColumn": "question", "answerColumn": "answer", "idColumn": "id", "shuffleSeed": 5},
    }  # fmt: skip
    return v1alpha1.parse_job(raw)


async def test_rendered_feeder_feeds_each_row_once_to_a_user_environment(
    tmp_path: Path, redis_server: redis_server_mod.RedisServer
) -> None:
    """A dataset job as the operator renders it: the feeder, started from its container, reads the rows
    of the ConfigMap where its pod mounts it, and the env pod, started from its own, serves the job's
    ``py:`` environment (allowed because the job names it). Each row's group lands in the buffer once."""
    job = dataset_job()
    children = render.render_children(job, config.OperatorConfig(redis_url="redis://placeholder"))
    config_dir = rendered_pods.mount_configmap(children, tmp_path)
    rw = rendered_pods.Rewriter(job, config_dir=config_dir, redis_url=redis_server.url)
    by_name = rendered_pods.containers(children)
    feeder = by_name["feeder"]
    # The ConfigMap's volume as the kubelet would mount it: one file per key, under the rendered mount.
    mounted = tmp_path / "datasets"
    rendered_mount = dataset_api.CONFIG_MAP_MOUNT / "math-rows"
    assert str(rendered_mount) in {m["mountPath"] for m in feeder["volumeMounts"]}
    (mounted / "math-rows").mkdir(parents=True)
    lines = (EXAMPLE.parents[1] / "dev/data/math.jsonl").read_text().splitlines()[:ROWS]
    (mounted / "math-rows" / "math.jsonl").write_text("\n".join(lines) + "\n")
    prefix = f"{NAMESPACE}/{job.name}"
    redis = aioredis.Redis.from_url(redis_server.url, protocol=2)
    stale = [k async for k in redis.scan_iter(f"treadle:*{{{prefix}}}*")]
    await redis.delete(*stale or ["-"])

    with stack_mod.Stack(tmp_path / "run") as stack:
        _, sched_port = await rendered_pods.launch_rendered(stack, rw, by_name, tmp_path)
        argv, port = rw.command(feeder)
        argv += ["--config-map-mount", str(mounted), "--interval-s", "0.1"]  # where the kubelet mounts
        await stack.launch("feeder", argv, port=port, kind="http", env=rw.env(feeder))
        scheduler = scheduler_client.SchedulerClient(f"127.0.0.1:{sched_port}", token=rw.token)
        buffer = buffer_client.BufferClient(f"127.0.0.1:{rw.ports['buffer']}", token=rw.token)
        try:
            deadline = time.monotonic() + 120
            headers = {auth.HEADER: auth.header_value(rw.token)}
            async with httpx.AsyncClient(timeout=5, headers=headers) as http:
                while True:
                    (feed,) = (await http.get(f"http://127.0.0.1:{port}/v1/feeds")).json()
                    stats = await scheduler.stats()
                    if feed["done"] and scheduler_client.settled(stats):
                        break
                    assert time.monotonic() < deadline, f"{feed} {stats}\n{stack.procs['feeder'].tail()}"
                    await asyncio.sleep(0.2)
            assert stats.completed == stats.submitted == ROWS * 2, dict(stats.failed_by_reason)
            batch = await buffer.get_batch(batch_size=ROWS * 2, version=0, timeout_s=10)
        finally:
            await scheduler.aclose()
            await buffer.aclose()
    await redis.aclose()
    per_group = collections.Counter(t.group_id for t in batch.trajectories)
    ids = [json.loads(line)["id"] for line in lines]
    assert per_group == {f"gem-math:e0:{i}": 2 for i in ids}  # every row once, none twice
    questions = {json.loads(line)["question"] for line in lines}
    assert all(t.prompt in questions for t in batch.trajectories)  # the user environment's prompt: the row's


@pytest.mark.parametrize(
    ("drop", "field"),
    [("TREADLE_CONFIG", "TREADLE_CONFIG"), ("TREADLE_PLACEMENT_ADDR", "TREADLE_PLACEMENT_ADDR")],
    ids=["no-config", "no-placement"],
)
async def test_scheduler_without_its_config_fails_at_startup(tmp_path: Path, drop: str, field: str) -> None:
    job, children = rendered()
    config_dir = rendered_pods.mount_configmap(children, tmp_path)
    rw = rendered_pods.Rewriter(job, config_dir=config_dir, redis_url="redis://127.0.0.1:1/0")
    c = rendered_pods.containers(children)["scheduler"]
    argv, _ = rw.command(c)
    env = {k: v for k, v in rw.env(c).items() if k != drop}
    proc = await asyncio.create_subprocess_exec(
        *argv, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    _, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode == 2
    assert f"configuration error: {field}: not set" in err.decode()


VERSION = {"planner": 3, "executor": 5}
"""Each agent's weights as the trainer labelled its engines (distinct, so a misplaced turn shows)."""


def two_agent_job() -> v1alpha1.RolloutJob:
    """One planner and two executor replicas of one instance shape, taking turns in one task."""
    agent = {"model": "Qwen/Qwen2.5-7B-Instruct", "maxModelLen": 4096}
    return v1alpha1.parse_job({
        "apiVersion": "treadle.dev/v1alpha1", "kind": "RolloutJob",
        "metadata": {"name": "marl", "namespace": NAMESPACE},
        "spec": {
            "agents": [{"name": "planner", **agent}, {"name": "executor", **agent}],
            "pools": [
                {"name": "plan", "agent": "planner", "accelerator": "H20", "replicas": 1},
                {"name": "exec", "agent": "executor", "accelerator": "H20", "replicas": 2},
            ],
            "tasks": [{"name": "pe", "agents": ["planner", "executor"], "environment": "math-tool",
                       "reward": "math", "groupSize": 4, "maxTurns": 6}],
            # The job's field, through the rendered ConfigMap: placement measures twice a second.
            "rollout": {"batchSize": 8, "staleness": 8, "rebalance": {"intervalSeconds": 0.5}},
            "weights": {"store": "local", "replicas": 1},
        },
    })  # fmt: skip


async def test_rendered_two_agent_job_moves_a_worker_registered_by_its_agent(
    tmp_path: Path, redis_server: redis_server_mod.RedisServer
) -> None:
    """Cluster-mode rebalancing: every worker registers itself (its agent's reporter, from the pod's
    ``TREADLE_POOL`` and ``TREADLE_ENGINE_URL``), and placement, started from its rendered container
    alone, moves an executor worker to the planner, whose one worker holds the longer queue."""
    job = two_agent_job()
    children = render.render_children(job, config.OperatorConfig(redis_url="redis://placeholder"))
    config_dir = rendered_pods.mount_configmap(children, tmp_path)
    rw = rendered_pods.Rewriter(job, config_dir=config_dir, redis_url=redis_server.url)
    by_name: dict[str, dict[str, Any]] = {}
    pods: dict[str, dict[str, dict[str, Any]]] = {}
    for child in children:
        if child["kind"] == "Deployment":
            named = {c["name"]: c for c in child["spec"]["template"]["spec"]["containers"]}
            pods[child["metadata"]["name"]] = named
            by_name |= named
    redis = aioredis.Redis.from_url(redis_server.url, protocol=2)
    prefix = f"{NAMESPACE}/{job.name}"
    await redis.delete(*[k async for k in redis.scan_iter(f"treadle:buf:{{{prefix}}}:*")] or ["-"])

    with stack_mod.Stack(tmp_path / "run") as stack:
        for name in ("buffer", "placement", "env", "reward"):
            argv, port = rw.command(by_name[name])
            if name == "placement":  # the SIMULATED engines below take a move's label, not its weights
                argv.append("--no-apply-weights")
            kind = "grpc" if name in render_common.COORDINATION else "http"
            await stack.launch(name, argv, port=port, kind=kind, env=rw.env(by_name[name]))
        # One pod per replica; each has its own loopback, so each engine and agent gets its own ports.
        engines: dict[str, str] = {}
        home: dict[str, str] = {}
        pod_dirs: dict[str, Path] = {}
        for pool in job.spec.pools:
            pod = pods[render_common.child_name(job, "pool", pool.name)]
            for i in range(pool.replicas):
                worker = f"{pool.name}-{i}"  # the pod's name, which the agent takes as its worker id
                engine_port, agent_port = procs.free_port(), procs.free_port()
                await stack.launch(
                    f"engine-{worker}",
                    [sys.executable, "-m", "treadle.services.fakevllm", "--host", "127.0.0.1",
                     "--port", str(engine_port), "--max-model-len", "4096", "--max-num-seqs", "2",
                     "--step-ms", "2"],
                    port=engine_port, kind="http", health_path="/health",
                )  # fmt: skip
                argv, _ = rw.command(pod["agent"])
                argv[argv.index("--port") + 1] = str(agent_port)
                env = rw.env(pod["agent"])
                assert env["TREADLE_POOL"] == pool.name
                assert env["TREADLE_ENGINE_URL"] == f"http://127.0.0.1:{rw.ports['vllm']}"
                env["TREADLE_ENGINE_URL"] = f"http://127.0.0.1:{engine_port}"
                env["TREADLE_METRICS_PORT"] = str(procs.free_port())  # its pod's own, as the agent port
                pod_dirs[worker] = tmp_path / "pods" / worker  # the pod's emptyDir
                pod_dirs[worker].mkdir(parents=True)
                env["TREADLE_AGENT_STATE"] = env["TREADLE_AGENT_STATE"].replace(
                    render_pool.AGENT_STATE_DIR, str(pod_dirs[worker])
                )
                await stack.launch(
                    f"agent-{worker}", [*argv, "--worker-id", worker], port=agent_port, kind="http", env=env
                )
                engines[worker] = f"http://127.0.0.1:{engine_port}"
                home[worker] = pool.agent
        sched_argv, sched_port = rw.command(by_name["scheduler"])
        await stack.launch(
            "scheduler", sched_argv, port=sched_port, kind="grpc", env=rw.env(by_name["scheduler"])
        )

        placement = placement_client.PlacementClient(f"127.0.0.1:{rw.ports['placement']}", token=rw.token)
        scheduler = scheduler_client.SchedulerClient(f"127.0.0.1:{sched_port}", token=rw.token)
        buffer = buffer_client.BufferClient(f"127.0.0.1:{rw.ports['buffer']}", token=rw.token)
        try:
            async with httpx.AsyncClient(timeout=10) as http:
                for worker, url in engines.items():  # the trainer's part: each agent's weights loaded
                    label = agent_client.label(home[worker], VERSION[home[worker]])
                    await http.post(url + "/update_weight_version", json={"new_version": label})
            deadline = time.monotonic() + 30
            while True:
                state = await placement.pool_state()
                if len(state.workers) == len(engines) and {a.weight_version for a in state.agents} == set(
                    VERSION.values()
                ):
                    break
                assert time.monotonic() < deadline, f"{state}\n{stack.procs['placement'].tail()}"
                await asyncio.sleep(0.1)
            # Each agent registered its engine at the address placement dials to swap its weights.
            assert {w.worker.worker_id: w.worker.engine_address for w in state.workers} == engines

            groups = 12
            await scheduler.submit(
                [scheduler_pb2.PromptGroup(group_id=f"g{i}", task="pe", seed=i) for i in range(groups)]
            )
            deadline = time.monotonic() + 240
            while True:
                stats = await scheduler.stats()
                if scheduler_client.settled(stats):
                    break
                assert time.monotonic() < deadline, f"{stats}\n{stack.procs['placement'].tail()}"
                await asyncio.sleep(0.2)
            assert stats.completed == stats.submitted == groups * 4, dict(stats.failed_by_reason)

            pools = await placement.pool_state()
            assert pools.rebalance_moves >= 1, stack.procs["placement"].tail()
            assert {a.agent: a.moved_in for a in pools.agents}["planner"] >= 1
            assert all(a.instances >= 1 for a in pools.agents)
            now = {w.worker.worker_id: w.agent for w in pools.workers}
            async with httpx.AsyncClient(timeout=10) as http:
                labels = {w: (await http.get(url + "/weight_info")).json()["weight_version"]
                          for w, url in engines.items()}  # fmt: skip
            # Every engine carries the weights of the agent it serves now, moved or not.
            assert labels == {w: agent_client.label(agent, VERSION[agent]) for w, agent in now.items()}
            # Each moved worker's agent recorded what it serves where a restart of it would look.
            for worker, agent in now.items():
                if agent != home[worker]:
                    kept = json.loads((pod_dirs[worker] / "agent.json").read_text())
                    assert (kept["agent"], kept["label"]) == (agent, labels[worker])
            # A moved worker served its new agent's turns, tagged with that agent's version.
            batch = await buffer.get_batch(
                batch_size=stats.completed, version=0, timeout_s=10, agent="planner"
            )
            moved = {
                x.worker_id
                for t in batch.trajectories
                for x in t.turns
                if home[x.worker_id] != "planner" and set(x.output_versions) == {VERSION["planner"]}
            }
            assert moved, "no moved worker served the planner: the move proves nothing"
            assert all(
                set(x.output_versions) == {VERSION["planner"]} for t in batch.trajectories for x in t.turns
            )
        finally:
            await placement.aclose()
            await scheduler.aclose()
            await buffer.aclose()
    await redis.aclose()


async def test_rendered_weights_store_joins_the_mooncake_pool(
    tmp_path: Path, mooncake_master: mooncake_master_mod.MooncakeMaster
) -> None:
    """The ``J-weights`` pod of a ``weights.store: mooncake`` job, run from its rendered container:
    it finds the master in the pod's environment, reports SERVING on its probe port once its segment
    is mounted, and a published object lands in the memory it lends."""
    raw = yaml.safe_load((EXAMPLE.parent / "two-agent-flexmarl.yaml").read_text())
    raw["metadata"]["namespace"] = NAMESPACE
    job = v1alpha1.parse_job(raw)
    assert job.spec.weights.store == "mooncake"
    cfg = config.OperatorConfig(
        redis_url="redis://placeholder", mooncake_master=mooncake_master.master_address,
        mooncake_metadata_url=mooncake_master.metadata_url,
    )  # fmt: skip
    children = render.render_children(job, cfg)
    rw = rendered_pods.Rewriter(
        job, config_dir=rendered_pods.mount_configmap(children, tmp_path), redis_url="redis://127.0.0.1:1/0"
    )
    weights = rendered_pods.containers(children)["weights"]
    argv, port = rw.command(weights)
    env = rw.env(weights) | {"MC_TCP_BIND_ADDRESS": "127.0.0.1"}  # tests listen on loopback only
    with stack_mod.Stack(tmp_path / "run") as stack:
        await stack.launch("weights", argv, port=port, kind="grpc", env=env, timeout_s=60)
        client = mooncake_client.MooncakeStore(
            mooncake_client.MooncakeConfig(
                mooncake_master.master_address, mooncake_master.metadata_url, replicas=1
            )
        )
        try:
            key, data = f"rendered-store/{port}", bytes(range(256)) * 64
            await asyncio.to_thread(client.put, key, data)
            assert await asyncio.to_thread(client.get, key) == data
            await asyncio.to_thread(client.remove, key)
        finally:
            client.close()
        assert f"master={mooncake_master.master_address}" in stack.procs["weights"].tail()
