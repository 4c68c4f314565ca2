"""The job's trainer runs from its rendered Job and the job's status shows what it did.

A job with ``spec.trainer`` is rendered by the pure renderers and its pods started as processes on
127.0.0.1 (``rendered_pods``): buffer, placement, env, reward, one inference replica (its agent as
rendered, its vLLM container replaced by the SIMULATED engine, which takes version labels but no
weights: placement swaps with ``--no-apply-weights``), the scheduler, and the trainer's container
(``python -m treadle.trainer.job``, its environment verbatim but for addresses). The test stands in
for the feeder and submits prompt groups. The scheduler's ``KUBECONFIG`` points at a FAKE API server
(an HTTP server on 127.0.0.1 that records requests): the real reporter and Kubernetes client write
there what a cluster's API server would receive.

Checked: the trainer exits 0 after ``spec.trainer.steps`` steps; the scheduler and the engine end
at that version; the job's status subresource receives ``policyVersion``, ``step`` and
``meanReward`` with the last step's values; the store holds the last versions.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import json
import os
import re
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import rendered_pods

from treadle.api import v1alpha1
from treadle.localmode import stack as stack_mod
from treadle.operator import config, render
from treadle.operator.render import common as render_common
from treadle.operator.render import pool as render_pool
from treadle.services.buffer import client as buffer_client
from treadle.services.scheduler import client as scheduler_client
from treadle.testing import procs
from treadle.testing import redis_server as redis_server_mod
from treadle.trainer import checkpoint, policy
from treadle.v1 import scheduler_pb2
from treadle.weights import layout

NAMESPACE = "team-a"
STEPS = 3
BATCH = 8
GROUP = 4
pytestmark = pytest.mark.timeout(600)


def job(uid: str = "uid-learn", **trainer: Any) -> v1alpha1.RolloutJob:
    return v1alpha1.parse_job({
        "apiVersion": "treadle.dev/v1alpha1", "kind": "RolloutJob",
        "metadata": {"name": "learn", "namespace": NAMESPACE, "uid": uid},
        "spec": {
            # The trainer generates the tiny Llama its name asks for (treadle.trainer.job.model_path).
            "agents": [{"name": "policy", "model": str(policy.model_dir(0)), "maxModelLen": 1024}],
            "pools": [{"name": "cpu", "agent": "policy", "accelerator": "H20", "replicas": 1}],
            "tasks": [{"name": "toy", "agents": ["policy"], "environment": "math-tool", "reward": "math",
                       "groupSize": GROUP, "maxTurns": 1}],
            "rollout": {"batchSize": BATCH, "staleness": 1},
            "weights": {"store": "local", "replicas": 1},
            "trainer": {"steps": STEPS, "threads": 1, "batchTimeoutSeconds": 300, **trainer},
        },
    })  # fmt: skip


class FakeApiServer(http.server.ThreadingHTTPServer):
    """FAKE Kubernetes API server: answers every request 200 ``{}`` and records it."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.requests: list[tuple[str, str, dict[str, Any]]] = []
        self.lock = threading.Lock()

    def _status_patches(self) -> list[dict[str, Any]]:
        path = f"/apis/treadle.dev/v1alpha1/namespaces/{NAMESPACE}/rolloutjobs/learn/status"
        with self.lock:
            return [body["status"] for method, p, body in self.requests if method == "PATCH" and p == path]

    def statuses(self) -> list[dict[str, Any]]:
        """The progress the scheduler wrote on the job's status, in order (its rollout patches aside)."""
        return [s for s in self._status_patches() if "policyVersion" in s]

    def rollouts(self) -> list[dict[str, Any]]:
        return [s["rollout"] for s in self._status_patches() if "rollout" in s]


class _Handler(http.server.BaseHTTPRequestHandler):
    server: FakeApiServer

    def do_PATCH(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
        with self.server.lock:
            self.server.requests.append(("PATCH", self.path, body))
        payload = b"{}"
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextlib.contextmanager
def fake_api_server(tmp_path: Path) -> Iterator[tuple[FakeApiServer, Path]]:
    server = FakeApiServer()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    thread.start()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters: [{{name: k, cluster: {{server: 'http://127.0.0.1:{server.server_address[1]}'}}}}]\n"
        "users: [{name: u, user: {token: t}}]\ncontexts: [{name: c, context: {cluster: k, user: u}}]\n"
    )
    try:
        yield server, kubeconfig
    finally:
        server.shutdown()
        server.server_close()


async def feed(scheduler: scheduler_client.SchedulerClient, task: str) -> None:
    """The feeder's part: keep about two batches of prompt groups queued until cancelled."""
    submitted = 0
    while True:
        if (await scheduler.stats()).pending < 2 * BATCH:
            groups = [scheduler_pb2.PromptGroup(group_id=f"g{submitted + i}", task=task, seed=submitted + i)
                      for i in range(BATCH // GROUP)]  # fmt: skip
            await scheduler.submit(groups)
            submitted += len(groups)
        await asyncio.sleep(0.2)


async def test_the_rendered_trainer_trains_and_its_progress_reaches_the_jobs_status(
    tmp_path: Path, redis_server: redis_server_mod.RedisServer
) -> None:
    the_job = job()
    children = render.render_children(the_job, config.OperatorConfig(redis_url="redis://placeholder"))
    by_name = rendered_pods.containers(children)
    (trainer_job,) = [c for c in children if c["kind"] == "Job"]
    (trainer,) = trainer_job["spec"]["template"]["spec"]["containers"]
    assert trainer["command"] == ["python", "-m", "treadle.trainer.job"]
    rw = rendered_pods.Rewriter(
        the_job, config_dir=rendered_pods.mount_configmap(children, tmp_path), redis_url=redis_server.url
    )
    weights_dir = tmp_path / "weights"  # the node's directory engines and trainer share
    rw.subs[render_pool.LOCAL_WEIGHTS_DIR] = str(weights_dir)

    with fake_api_server(tmp_path) as (api, kubeconfig), stack_mod.Stack(tmp_path / "run") as stack:
        # In a pod: the ServiceAccount's credentials; here: the fake API server's.
        _, sched_port = await rendered_pods.launch_rendered(
            stack, rw, by_name, tmp_path, scheduler_env={"KUBECONFIG": str(kubeconfig)}
        )
        engine_port = rw.ports["vllm"]
        scheduler = scheduler_client.SchedulerClient(f"127.0.0.1:{sched_port}", token=rw.token)
        feeding = asyncio.create_task(feed(scheduler, the_job.spec.tasks[0].name))
        log = tmp_path / "trainer.log"
        try:
            with log.open("wb") as out:
                proc = await asyncio.create_subprocess_exec(
                    sys.executable, *trainer["command"][1:],
                    env={**os.environ, **rw.env(trainer)}, stdout=out, stderr=out,
                )  # fmt: skip
                try:
                    rc = await asyncio.wait_for(proc.wait(), timeout=480)
                except TimeoutError:
                    proc.kill()
                    await proc.wait()
                    raise
            assert rc == 0, log.read_text()[-4000:]
            stats = await scheduler.stats()
            assert stats.version == STEPS
            # The scheduler reports every two seconds: wait for the last commit to be written.
            deadline = time.monotonic() + 30
            while not api.statuses() or api.statuses()[-1].get("policyVersion") != STEPS:
                assert time.monotonic() < deadline, (api.requests, stack.procs["scheduler"].tail())
                await asyncio.sleep(0.2)
        finally:
            feeding.cancel()
            await asyncio.gather(feeding, return_exceptions=True)
            await scheduler.aclose()
        statuses = api.statuses()
        last = statuses[-1]
        assert (last["policyVersion"], last["step"]) == (STEPS, STEPS)
        assert 0.0 <= last["meanReward"] <= 1.0
        assert [s["policyVersion"] for s in statuses] == sorted(s["policyVersion"] for s in statuses)
        # ... and its own counts, at most every 10 s: the first one already written
        assert api.rollouts() and all(r["completed"] >= 0 for r in api.rollouts())
        trained = log.read_text()
        assert f"step {STEPS:3d}" in trained and f"version {STEPS} committed" in trained
        # The engine serves the last version (its label: the SIMULATED engine loads no weights).
        async with httpx.AsyncClient(timeout=10) as http:
            label = (await http.get(f"http://127.0.0.1:{engine_port}/weight_info")).json()["weight_version"]
        assert label == str(STEPS)
        # The trainer published to the store the engines read, under the job's prefix.
        prefix = render_common.prefix_of(the_job)
        assert prefix.startswith(f"{NAMESPACE}/learn")
        assert (weights_dir / layout.manifest_key(prefix, STEPS)).exists()
        # ... and beside it, its optimizer state, which a restarted trainer goes on with.
        kept = checkpoint.prefix(prefix)
        assert (weights_dir / layout.manifest_key(kept, STEPS)).exists()


GROUP_STEPS = 12
KILL_AT = 3


def pod_env(
    rw: rendered_pods.Rewriter, container: dict[str, Any], index: int, master_port: int
) -> dict[str, str]:
    """A trainer pod's environment on this host: its node rank from its completion index (the downward
    API's part), the rendezvous Service as 127.0.0.1 and gloo on the loopback device."""
    literal = [e for e in container["env"] if "value" in e]
    (rank_ref,) = [e for e in container["env"] if "valueFrom" in e]
    assert rank_ref["name"] == "PET_NODE_RANK"
    assert "job-completion-index" in rank_ref["valueFrom"]["fieldRef"]["fieldPath"]
    env = rw.env({**container, "env": literal})
    assert (
        env["PET_NNODES"] == "2" and env["PET_NPROC_PER_NODE"] == "1" and env["GLOO_SOCKET_IFNAME"] == "eth0"
    )
    rw.metrics.pop(container["name"], None)  # each pod a metrics port of its own
    return env | {"PET_NODE_RANK": str(index), "PET_MASTER_ADDR": "127.0.0.1",
                  "PET_MASTER_PORT": str(master_port), "GLOO_SOCKET_IFNAME": "lo"}  # fmt: skip


async def test_a_two_pod_trainer_group_trains_and_resumes_after_a_pod_is_killed(
    tmp_path: Path, redis_server: redis_server_mod.RedisServer
) -> None:
    """``replicas: 2``: two pods of one rank each under ``torchrun`` train as one FSDP2 group. Pod 1 is
    killed (SIGKILL, its whole process group) after step 3 is committed; pod 0 fails in its next
    collective; both are started again, as the Job does, and the group goes on from the committed
    version with Adam's state. Every version is committed once, in order, and the buffer's acks are
    exactly the committed steps' batches."""
    # A uid of its own: the session's Redis still holds the other test's job (its keys carry the uid).
    the_job = job("uid-learn-group", replicas=2, steps=GROUP_STEPS)
    children = render.render_children(the_job, config.OperatorConfig(redis_url="redis://placeholder"))
    by_name = rendered_pods.containers(children)
    (trainer_job,) = [c for c in children if c["kind"] == "Job"]
    assert trainer_job["spec"]["completionMode"] == "Indexed" and trainer_job["spec"]["completions"] == 2
    (trainer,) = trainer_job["spec"]["template"]["spec"]["containers"]
    assert trainer["command"] == ["python", "-m", "torch.distributed.run", "--module", "treadle.trainer.job"]
    rw = rendered_pods.Rewriter(
        the_job, config_dir=rendered_pods.mount_configmap(children, tmp_path), redis_url=redis_server.url
    )
    weights_dir = tmp_path / "weights"
    rw.subs[render_pool.LOCAL_WEIGHTS_DIR] = str(weights_dir)

    with fake_api_server(tmp_path) as (api, kubeconfig), stack_mod.Stack(tmp_path / "run") as stack:
        _, sched_port = await rendered_pods.launch_rendered(
            stack, rw, by_name, tmp_path, scheduler_env={"KUBECONFIG": str(kubeconfig)}
        )
        scheduler = scheduler_client.SchedulerClient(f"127.0.0.1:{sched_port}", token=rw.token)
        buffer = buffer_client.BufferClient(
            rw.subs[render_common.endpoints(the_job)["buffer"]], token=rw.token
        )
        feeding = asyncio.create_task(feed(scheduler, the_job.spec.tasks[0].name))

        async def start(run: int) -> list[asyncio.subprocess.Process]:
            port = procs.free_port()
            pods = []
            for index in range(2):
                out = (tmp_path / f"trainer-{run}-{index}.log").open("wb")
                pods.append(await asyncio.create_subprocess_exec(
                    sys.executable, *trainer["command"][1:],
                    env={**os.environ, **pod_env(rw, trainer, index, port)}, stdout=out, stderr=out,
                    start_new_session=True,
                ))  # fmt: skip
            return pods

        try:
            first = await start(1)
            deadline = time.monotonic() + 400
            while (await scheduler.stats()).step < KILL_AT:
                assert time.monotonic() < deadline, (tmp_path / "trainer-1-0.log").read_text()[-3000:]
                assert all(p.returncode is None for p in first), (tmp_path / "trainer-1-0.log").read_text()[
                    -3000:
                ]
                await asyncio.sleep(0.2)
            kill_tree(first[1].pid)  # pod 1 deleted: every process in it dies
            rc = await asyncio.wait_for(first[0].wait(), timeout=300)
            assert rc != 0, "rank 0 went on without its peer"
            await first[1].wait()
            at_kill = await scheduler.stats()
            second = await start(2)
            rcs = await asyncio.wait_for(asyncio.gather(*(p.wait() for p in second)), timeout=480)
            logs = [(tmp_path / f"trainer-2-{i}.log").read_text() for i in range(2)]
            assert rcs == [0, 0], logs[0][-4000:] + logs[1][-2000:]
            stats = await scheduler.stats()
            buffered = await buffer.stats()
        finally:
            feeding.cancel()
            await asyncio.gather(feeding, return_exceptions=True)
            await scheduler.aclose()
            await buffer.aclose()
    # One version per step left; one more number when the kill fell between a publication and its commit
    # (that version was never committed: a restarted trainer publishes after the newest in the store).
    assert stats.step == GROUP_STEPS
    assert 0 <= stats.version - (at_kill.version + GROUP_STEPS - at_kill.step) <= 1, (stats, at_kill)
    resumed = logs[0]
    assert "2 rank(s) on cpu" in resumed
    assert f"resumed from version {at_kill.version}'s weights, after step {at_kill.step}" in resumed
    assert f"resumed Adam's state of version {at_kill.version}" in resumed
    # Each version reached the job's status once, in order: none committed twice.
    versions = [s["policyVersion"] for s in api.statuses()]
    assert versions == sorted(set(versions)) and versions[-1] == stats.version
    # Only the committed steps' batches were acked; a batch trained but not committed at the kill was not.
    first_log = (tmp_path / "trainer-1-0.log").read_text()
    committed = {
        int(m.group(1)): int(m.group(2))
        for m in STEP_LINE.finditer(first_log)
        if int(m.group(1)) <= at_kill.step
    }
    committed |= {int(m.group(1)): int(m.group(2)) for m in STEP_LINE.finditer(resumed)}
    assert sorted(committed) == list(range(1, GROUP_STEPS + 1))
    assert buffered.acked == sum(committed.values()), (buffered, committed)


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and every process under it (torchrun starts its workers in sessions of their own,
    so a process group is not the pod: its cgroup is)."""
    root = psutil.Process(pid)
    for proc in [*root.children(recursive=True), root]:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()


STEP_LINE = re.compile(r"step +(\d+) +v\d+ +mean reward [-0-9.]+ +samples (\d+)")
