"""Issue 14's must-show on the dev cluster: ``helm install``, ``kubectl apply -f manifests/dev/learn.yaml``,
and a policy that learns, every pod the operator rendered running as processes on process nodes.

The cluster (``conftest.cluster``, shared with ``test_reward_models``): one CPU process node and one
process node with SIMULATED H20 GPUs (capacity and labels only), no KWOK node, so every pod that
schedules really runs. The chart runs Redis, the Mooncake master and the operator; the job runs
REAL vLLM (its CPU build) serving
the tiny random Llama of ``treadle.models.tiny`` on the GPU node, the agent sidecar, the math-tool
environment, the reward gateway (built-in ``letter-fraction``), scheduler, placement, buffer, the
feeder reading ``manifests/dev/data/letters.jsonl`` and Treadle's reference GRPO trainer as the job's
own pod. Nothing is simulated but the GPUs' existence (vLLM runs on the CPU).

Times (this machine: 2 cores shared with other work): vLLM on CPU is ready 60-100 s after its pod
starts; see the README's "on the dev cluster" for the measured totals.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import functools
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import dashcheck
import httpx
import pytest
import yaml
from devsetup import DEV, ROOT, SETUP, WEIGHTS, tool_env

from treadle.devcluster import kwok
from treadle.operator.render import common as render_common
from treadle.services.agent import service as agent_service
from treadle.testing import docblocks, prometheus_server

STEPS = 20
TRAIN_TIMEOUT_S = 1500.0
STEP_LINE = re.compile(r"^step\s+(\d+)\s+v(\d+)\s+mean reward\s+([0-9.]+)", re.MULTILINE)
T = TypeVar("T")


def poll(probe: Callable[[], T | None], what: str, timeout: float) -> T:
    """``probe()`` every 2 s until it is truthy; a kubectl failure counts as 'not yet'."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            if value := probe():
                return value
        except kwok.ClusterError as exc:
            last = exc
        time.sleep(2)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last error: {last})")


@pytest.fixture(autouse=True)
def no_job_left(cluster: kwok.DevCluster) -> Iterator[None]:
    """A test that failed before deleting its job must not leave it training beside the next one."""
    yield
    cluster.kubectl("delete", "rolloutjobs", "--all", "--wait=false")


def get(c: kwok.DevCluster, *what: str) -> Any:
    return json.loads(c.kubectl("get", *what, "-o", "json"))


def variant(name: str, source: dict[str, Any], *, pools: int | None = None) -> dict[str, Any]:
    """``learn.yaml`` under another name reading its rows from ``source``; ``pools``: replicas instead."""
    job = yaml.safe_load((DEV / "learn.yaml").read_text())
    job["metadata"]["name"] = name
    job["spec"]["tasks"][0]["dataset"]["source"] = source
    if pools is not None:
        job["spec"]["pools"][0]["replicas"] = pools
        del job["spec"]["trainer"]
    return job


def apply(c: kwok.DevCluster, *objects: dict[str, Any]) -> None:
    c.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(objects))


def ready(pod: dict[str, Any]) -> bool:
    """Every container ready; a pod with no container status yet is not."""
    statuses = pod["status"].get("containerStatuses") or []
    return bool(statuses) and all(s["ready"] for s in statuses)


def children(c: kwok.DevCluster, job: str) -> list[str]:
    """Every object the operator made for ``job`` (it labels them all with the job's instance)."""
    out = c.kubectl(
        "get", "deploy,rs,pod,svc,cm,job", "-l", f"app.kubernetes.io/instance={job}", "-o", "name"
    )
    return out.split()


def trainer_log(c: kwok.DevCluster, job: str) -> str:
    return c.kubectl("logs", "-l", f"treadle.dev/job={job},treadle.dev/component=trainer", "--tail=-1")


TRANSIENT = ("PodsNotReady", "Unschedulable")
"""Degraded reasons a starting job passes through (pods not ready yet, nodes being found)."""


def problem(
    status: dict[str, Any], tolerate: tuple[str, ...] = (), crashed: tuple[str, ...] = ()
) -> dict[str, Any] | None:
    """The job's Degraded condition when it is not one of the ``TRANSIENT`` ones (or ``tolerate``), nor
    the back-off of a container the test crashed on purpose (``crashed``: container names)."""
    conditions = status.get("conditions", [])
    found = next((x for x in conditions if x["type"] == "Degraded" and x["status"] == "True"), None)
    if found is None or found["reason"] in TRANSIENT + tolerate:
        return None
    message = found.get("message", "")
    if found["reason"] == "CrashLoopBackOff" and any(f"container {c} keeps" in message for c in crashed):
        return None
    return found


def crash_logs(c: kwok.DevCluster, job: str, degraded: dict[str, Any]) -> str:
    """The end of the log of the component a Degraded condition names ("trainer: ..."), the crashed
    container's included: what CI shows of a crash."""
    component = re.split(r"[ ,:]", degraded.get("message", ""), maxsplit=1)[0]  # "pool cpu: ..." is a pool
    selector = f"treadle.dev/job={job},treadle.dev/component={component}"
    logs = []
    for previous in ("--previous=true", "--previous=false"):
        try:
            logs.append(
                c.kubectl("logs", "-l", selector, previous, "--all-containers", "--tail=60", "--prefix")
            )
        except kwok.ClusterError as exc:  # a diagnostic: the assertion is what fails
            logs.append(f"(kubectl logs {previous}: {exc})")
    return "\n".join(logs)


def train(
    c: kwok.DevCluster,
    name: str,
    *,
    steps: int,
    tolerate: tuple[str, ...] = (),
    crashed: tuple[str, ...] = (),
) -> tuple[list[tuple[int, int]], list[float]]:
    """Watch the applied job ``name`` until STEP reaches ``steps``.

    Returns the distinct (STEP, POLICY) pairs ``kubectl get rolloutjobs`` showed, in order, and the
    trainer's mean reward per step from its log.
    """
    seen: list[tuple[int, int]] = []

    def progressed() -> bool:
        status = get(c, "rolloutjob", name).get("status", {})
        found = problem(status, tolerate, crashed)
        assert found is None, (status, crash_logs(c, name, found))
        pair = (int(status.get("step", 0)), int(status.get("policyVersion", 0)))
        if not seen or seen[-1] != pair:
            seen.append(pair)
        return pair[0] >= steps

    poll(progressed, f"{name} at step {steps}", TRAIN_TIMEOUT_S)
    # The printer columns show the same numbers, or later ones: training goes on meanwhile.
    table = c.kubectl("get", "rolloutjobs", name)
    row = re.search(rf"^{name}\s+\S+\s+\S+\s+(\d+)\s+(\d+)\b", table, re.MULTILINE)
    assert row and int(row[1]) >= seen[-1][1] and int(row[2]) >= seen[-1][0], (table, seen[-1])
    rewards = [float(m.group(3)) for m in STEP_LINE.finditer(trainer_log(c, name))]
    return seen, rewards


def delete(c: kwok.DevCluster, name: str) -> None:
    c.kubectl("delete", "rolloutjob", name, "--wait=true", timeout=120)
    poll(lambda: not children(c, name), f"every child of {name} gone", 120)


ROW = re.compile(r"^learn\s+\S+\s+\S+\s+(\d+)\s+(\d+)\b", re.MULTILINE)
"""A ``kubectl get rolloutjobs`` row of ``learn``: POLICY, STEP."""


README_STEPS = 3
"""The README's block runs as written until STEP reaches this: that its commands work is what it
shows. That the same job learns over its 20 steps is checked on ``make demo``'s run of it
(``e2e/demo/test_demo.py``), which applies the same file to the same kind of cluster."""


@pytest.mark.timeout(TRAIN_TIMEOUT_S + 300)
def test_learn_yaml_trains_on_the_dev_cluster(cluster: kwok.DevCluster) -> None:
    """The rest of the README's block, as written: apply, watch STEP and POLICY climb, read the
    trainer's log; the watch and the log are stopped once STEP is ``README_STEPS`` and as many step
    lines are in."""
    block = docblocks.block(ROOT, "dev-cluster-learn")
    began, last_check = time.monotonic(), 0.0

    def reached(seen: str) -> bool:
        nonlocal last_check
        if time.monotonic() - last_check > 10:  # a job that went Degraded fails now, not at the timeout
            last_check = time.monotonic()
            assert problem(get(cluster, "rolloutjob", "learn").get("status", {})) is None
        return any(int(step) >= README_STEPS for _, step in ROW.findall(seen))

    ran = docblocks.run(
        block.part(SETUP), env=tool_env(), cwd=ROOT, timeout_s=TRAIN_TIMEOUT_S,
        watch={"get rolloutjobs -w": reached,
               "logs -f": lambda seen: len(STEP_LINE.findall(seen)) >= README_STEPS},
    )  # fmt: skip
    watched = next(r.output for r in ran if "get rolloutjobs -w" in r.command)
    seen = [(int(step), int(policy)) for policy, step in ROW.findall(watched)]
    steps = [s for s, _ in seen]
    policies = [p for _, p in seen]
    assert steps == sorted(steps) and policies == sorted(policies), seen
    assert steps[-1] >= README_STEPS and policies[-1] >= README_STEPS, seen
    rewards = [float(m.group(3)) for m in STEP_LINE.finditer(ran[-1].output)]
    assert len(rewards) >= README_STEPS, rewards
    print(f"learn.yaml: {README_STEPS} steps in {time.monotonic() - began:.0f}s; mean reward {rewards}")
    # The trainer is a group of two pods (replicas: 2), ranks 0 and 1 of one FSDP2 group.
    trainers = get(cluster, "pod", "-l", "treadle.dev/job=learn,treadle.dev/component=trainer")["items"]
    indices = sorted(completion_index(p) for p in trainers)
    assert indices == ["0", "1"], [p["metadata"]["name"] for p in trainers]
    # The scheduler's own account of the rollout, as the job's status carries it and treadle status says it.
    rollout = poll(
        lambda: get(cluster, "rolloutjob", "learn").get("status", {}).get("rollout", {}).get("completed"),
        "the scheduler's rollout counts on the job's status", timeout=30,
    )  # fmt: skip
    assert rollout >= README_STEPS * 4 * 8 // 2, rollout  # the steps' 4 groups of 8: most were stored
    status = subprocess.run(
        [sys.executable, "-m", "treadle.cli", "status", "learn", "--kubeconfig", str(cluster.kubeconfig)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert status.returncode == 0 and "trajectories/min" in status.stdout, status.stdout + status.stderr
    delete(cluster, "learn")


CONFIG_MAP = {"configMap": {"name": "letters", "key": "letters.jsonl"}}
URL = {"url": "http://datasets:8000/letters.jsonl"}
"""Served by a pod of the job's namespace (the search list resolves ``datasets``): a pod cannot reach
the host's 127.0.0.1, its loopback is its own."""


def serve_datasets(c: kwok.DevCluster) -> None:
    """``python -m http.server`` over the ``letters`` ConfigMap, as the Service ``datasets``."""
    apply(c, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "datasets", "labels": {"app": "datasets"}},
        "spec": {
            "containers": [{
                "name": "http", "image": "ghcr.io/treadle-dev/treadle-services:0.1.0",
                "command": ["python", "-m", "http.server", "8000", "--directory", "/srv"],
                "readinessProbe": {"httpGet": {"path": "/letters.jsonl", "port": 8000}, "periodSeconds": 1},
                "volumeMounts": [{"name": "letters", "mountPath": "/srv"}],
            }],
            "volumes": [{"name": "letters", "configMap": {"name": "letters"}}],
        },
    }, {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "datasets"},
        "spec": {"selector": {"app": "datasets"}, "ports": [{"port": 8000}]},
    })  # fmt: skip


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("source", "answer_column", "says"),
    [
        ({"path": "/var/lib/treadle/datasets/letters.jsonl"}, "reference", "reference"),
        ({"path": "/var/lib/treadle/datasets/missing.jsonl"}, "answer", "missing.jsonl"),
        ({"url": "http://nowhere.invalid:8000/letters.jsonl"}, "answer", "nowhere.invalid"),
    ],
    ids=["missing-column", "unreadable-file", "unreachable-url"],
)
def test_an_unusable_dataset_degrades_the_job_naming_the_field(
    cluster: kwok.DevCluster, source: dict[str, Any], answer_column: str, says: str
) -> None:
    """No inference replica and no trainer: only the feeder's verdict matters here."""
    name = "bad-dataset"
    job = variant(name, source, pools=0)
    job["spec"]["tasks"][0]["dataset"]["answerColumn"] = answer_column
    apply(cluster, job)

    condition = poll(lambda: problem(get(cluster, "rolloutjob", name).get("status", {})), "Degraded", 180)
    assert "spec.tasks[0].dataset" in condition["message"] and says in condition["message"], condition
    feeder = get(cluster, "pod", "-l", f"treadle.dev/job={name},treadle.dev/component=feeder")["items"]
    assert feeder and all(s["restartCount"] == 0 for p in feeder for s in p["status"]["containerStatuses"])
    delete(cluster, name)


def key_prefix(c: kwok.DevCluster, job: str) -> str:
    """The job's key prefix in Redis, also its Redis user: ``<namespace>/<job>/<uid>``."""
    return render_common.job_prefix("default", job, get(c, "rolloutjob", job)["metadata"]["uid"])


def epoch_rows(c: kwok.DevCluster, job: str, epoch: int) -> dict[str, int]:
    """Trajectories per row of ``epoch`` that reached the job's buffer: its ``seen`` set in the chart's
    Redis (``redis_store``; trained groups leave their other keys), trajectory ids ``<group>-<i>``
    with group ids ``<task>:e<epoch>:<row id>`` (``feeder.service.group_id``)."""
    import redis  # the test's own client of the chart's Redis, reached on its pod IP over the bridge

    pod = get(c, "pod", "-n", "treadle-system", "-l", "app.kubernetes.io/component=redis")["items"][0]
    # The chart's Redis requires its admin password (the chart's Secret, docs/SECURITY.md).
    secret = get(c, "secret", "-n", "treadle-system", "treadle-treadle-auth")
    password = base64.b64decode(secret["data"]["redis-password"]).decode()
    client = redis.Redis(host=pod["status"]["podIP"], port=6379, password=password, protocol=2,
                         decode_responses=True)  # fmt: skip
    try:
        key = f"treadle:buf:{{{key_prefix(c, job)}}}:seen"
        seen: set[str] = client.smembers(key)  # type: ignore[assignment]
    finally:
        client.close()
    prefix = f"letters:e{epoch}:"
    rows = collections.Counter(t.removeprefix(prefix).rsplit("-", 1)[0] for t in seen if t.startswith(prefix))
    return dict(rows)


FAULTS = ("scheduler", "buffer", "placement", "env", "reward")
"""The job's pods deleted in turn by the faults test, one every 2 steps: each comes back as a new pod."""
CRASHES = ("agent", "vllm")
"""The inference pod's containers crashed in turn by the faults test, after the trainer group's restart:
the pod stays, the container restarts in it (the agent with no state but its pod's ``emptyDir``; vLLM
on the base checkpoint, which its agent must take back to the committed version before it gets a
turn)."""
REUSED_NAME = "learn-faults"
"""The faults test's job name, which the swap test (after it in this file) re-creates."""


RESUMED = re.compile(r"resumed from version (\d+)'s weights, after step (\d+)")


@pytest.mark.timeout(TRAIN_TIMEOUT_S + 900)
def test_each_of_a_jobs_pods_deleted_in_turn_loses_no_row_and_trains_no_step_twice(
    cluster: kwok.DevCluster,
) -> None:
    """Issue 18's fault suite on running pods, rows from a ConfigMap: from step 2, one of the job's
    scheduler, buffer, placement, environment and reward pods is deleted every 2 steps (the
    scheduler's replacement takes up from its journal in Redis the groups the old one had accepted;
    the buffer's rows live in the chart's Redis; placement, the environment and the reward gateway
    hold nothing a restart may lose), then the chart's Redis crashes (its process killed: the
    container restarts and replays its AOF, and the operator sets up the job's Redis user again),
    then the pod of the trainer group's rank 1 is deleted (rank 0 fails in its next collective and its
    container restarts in place, the Job starts another pod for index 1, and the group goes on from
    the committed version with Adam's state), then the inference pod's agent and vLLM containers crash
    in turn (``CRASHES``). The trainer rides each restart out (its calls wait out Unavailable), the
    job never reports a problem beyond pods starting (and the back-off of the containers crashed on
    purpose) and its STEP never goes back, every row of epoch 0 still reaches the buffer with its 8
    trajectories (before the scheduler's journal, 4 of 64 never did), no step is trained twice or
    skipped, none on tokens staler than the bound, and the job's ``status.trainer`` counts the
    group's restart."""
    name = REUSED_NAME
    apply(cluster, variant(name, CONFIG_MAP))
    pods = poll(lambda: len(trainer_pods(cluster, name)) == 2, f"two trainer pods of {name}", 300)
    assert pods
    shown: list[tuple[int, int]] = []
    for i, component in enumerate(FAULTS):
        shown += train(cluster, name, steps=2 * (i + 1))[0]
        replace_pod(cluster, name, component)
    shown += train(cluster, name, steps=2 * (len(FAULTS) + 1))[0]
    crash_redis(cluster)
    # While Redis restarts the job says so (Degraded, RedisUnavailable), until a reconcile after.
    redis_down = ("RedisUnavailable",)
    shown += train(cluster, name, steps=2 * (len(FAULTS) + 2), tolerate=redis_down)[0]
    (rank1,) = [p for p in trainer_pods(cluster, name) if completion_index(p) == "1"]
    cluster.kubectl("delete", "pod", rank1["metadata"]["name"], "--wait=false")
    crashed = ("trainer", *CRASHES)  # rank 0's container fails with its peer gone and restarts
    for i, container in enumerate(CRASHES):
        at = 2 * (len(FAULTS) + 3 + i)
        shown += train(cluster, name, steps=at, tolerate=redis_down, crashed=crashed)[0]
        crash_container(cluster, name, "pool", container)
        # vLLM comes back on the base checkpoint: its agent takes it to the committed version.
        (pod,) = ready_pods(cluster, name, "pool")
        serving = functools.partial(serving_committed, cluster, name, pod)
        poll(serving, f"the pod serving the committed version after its {container} crashed", 240)
    shown += train(cluster, name, steps=STEPS, tolerate=redis_down, crashed=crashed)[0]
    assert_epoch_whole(cluster, name)
    steps_shown = [step for step, _ in shown]
    assert steps_shown == sorted(steps_shown), shown  # kubectl's STEP never went back
    (leader,) = [p for p in trainer_pods(cluster, name) if completion_index(p) == "0"]
    log = cluster.kubectl("logs", leader["metadata"]["name"], "--tail=-1")  # the restarted container's
    resumed = RESUMED.search(log)
    assert resumed and int(resumed[2]) >= 2 * (len(FAULTS) + 2), log[-3000:]
    assert f"resumed Adam's state of version {resumed[1]}" in log, log[-3000:]  # and its optimizer with it
    assert "2 rank(s) on cpu" in log, log[-3000:]
    steps = [int(m.group(1)) for m in STEP_LINE.finditer(log)]
    assert steps == list(range(int(resumed[2]) + 1, STEPS + 1)), steps  # none again, none skipped
    # Through both container crashes no step trained on tokens staler than the bound (vLLM came back on
    # the base checkpoint: its agent reloaded the committed version before the worker got a turn).
    staleness = [int(x) for x in re.findall(r"\bstaleness (\d+)", log)]
    alpha = int(variant(name, CONFIG_MAP)["spec"]["rollout"]["staleness"])
    assert len(staleness) == len(steps) and max(staleness) <= alpha, staleness
    trainer = get(cluster, "rolloutjob", name)["status"]["trainer"]
    assert trainer["pods"] == 2 and trainer["restarts"] >= 1, trainer
    print(f"{name}: staleness per step of the restarted group {staleness}; status.trainer {trainer}")
    print(f"{name}: the group resumed at version {resumed[1]}, step {resumed[2]}; rewards "
          f"{[float(m.group(3)) for m in STEP_LINE.finditer(log)]}")  # fmt: skip
    delete(cluster, name)


def trainer_pods(c: kwok.DevCluster, job: str) -> list[dict[str, Any]]:
    """The trainer group's pods that are running (not terminating)."""
    pods = get(c, "pod", "-l", f"treadle.dev/job={job},treadle.dev/component=trainer")["items"]
    return [p for p in pods if not p["metadata"].get("deletionTimestamp") and ready(p)]


def completion_index(pod: dict[str, Any]) -> str:
    return str(pod["metadata"]["labels"].get("batch.kubernetes.io/job-completion-index"))


def replace_pod(c: kwok.DevCluster, job: str, component: str) -> None:
    """Delete ``job``'s ``component`` pod; return once its replacement is ready."""
    before = {p["metadata"]["name"] for p in ready_pods(c, job, component)}
    c.kubectl("delete", "pod", "-l", f"treadle.dev/job={job},treadle.dev/component={component}")
    after = lambda: {p["metadata"]["name"] for p in ready_pods(c, job, component)} - before  # noqa: E731
    poll(after, f"a new {component} pod of {job} ready", 240)


def crash_redis(c: kwok.DevCluster) -> None:
    """SIGKILL the chart's Redis server (its container crashes: the node agent restarts it on the same
    AOF); return once the container is ready again."""
    selector = ["-n", "treadle-system", "-l", "app.kubernetes.io/component=redis"]
    (pod,) = get(c, "pod", *selector)["items"]
    restarts = pod["status"]["containerStatuses"][0]["restartCount"]
    pids = subprocess.run(["pgrep", "-x", "redis-server"], capture_output=True, text=True, check=True)
    # Other Redis servers may run too (the suite's own; another test's dev cluster): the container's
    # process is a child of this cluster's node agent. (Not found by HOSTNAME: Redis writes its
    # process title over the memory /proc/PID/environ shows.)
    (pid,) = [p for p in pids.stdout.split() if _node_agent_of(p) == c.name]
    os.kill(int(pid), signal.SIGKILL)

    def back() -> bool:
        (now,) = get(c, "pod", *selector)["items"]
        status = now["status"]["containerStatuses"][0]
        return bool(status["restartCount"] > restarts and status["ready"])

    poll(back, "the chart's Redis restarted and ready", 120)


def crash_container(c: kwok.DevCluster, job: str, component: str, container: str) -> None:
    """SIGKILL ``container`` of ``job``'s ``component`` pod, its whole process group (as the OOM killer
    takes a container's cgroup); return once the pod's node agent restarted it and it is ready."""
    (pod,) = ready_pods(c, job, component)
    pod_name = pod["metadata"]["name"]
    restarts = {s["name"]: s["restartCount"] for s in pod["status"]["containerStatuses"]}[container]
    # A container's process runs in its own work directory under its pod's: <ns>_<pod>_<uid>/<name>/work.
    work = f"_{pod_name}_{pod['metadata']['uid']}/{container}/work"
    pids = [d.name for d in Path("/proc").iterdir() if d.name.isdigit()]
    (pid,) = [p for p in pids if _cwd(p).endswith(work) and _node_agent_of(p) == c.name]
    os.killpg(int(pid), signal.SIGKILL)
    began = time.monotonic()

    def back() -> bool:
        now = get(c, "pod", pod_name)
        status = {s["name"]: s for s in now["status"]["containerStatuses"]}[container]
        return bool(status["restartCount"] > restarts and status["ready"])

    poll(back, f"{container} of {pod_name} restarted and ready", 300)
    print(f"{job}: {container} (pid {pid}) killed; restarted and ready in {time.monotonic() - began:.0f}s")


def _cwd(pid: str) -> str:
    try:
        return os.readlink(f"/proc/{pid}/cwd")
    except OSError:  # gone meanwhile, or not ours to read
        return ""


def _node_agent_of(pid: str) -> str | None:
    """The cluster whose node agent started process ``pid`` (None: not a node agent's)."""
    try:
        parent = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]
        args = Path(f"/proc/{parent}/cmdline").read_bytes().decode().split("\0")
    except OSError:  # the process (or its parent) ended meanwhile
        return None
    if "treadle.devcluster.nodeagent" not in args or "--cluster" not in args:
        return None
    return args[args.index("--cluster") + 1]


def assert_epoch_whole(c: kwok.DevCluster, name: str) -> None:
    """Every row of epoch 0 reached the buffer with its 8 trajectories."""
    rows = [json.loads(line)["id"] for line in (DEV / "data" / "letters.jsonl").read_text().splitlines()]
    # Epoch 0 ends near step 16: its last groups may still be landing when STEP reaches 20.
    deadline = time.monotonic() + 60
    found = epoch_rows(c, name, 0)
    while set(found) < set(rows) and time.monotonic() < deadline:
        time.sleep(2)
        found = epoch_rows(c, name, 0)
    assert found == dict.fromkeys(rows, 8), sorted(set(rows) - set(found))


def ready_pods(c: kwok.DevCluster, job: str, component: str) -> list[dict[str, Any]]:
    pods = get(c, "pod", "-l", f"treadle.dev/job={job},treadle.dev/component={component}")["items"]
    return [p for p in pods if ready(p)]


SWAP_LINE = re.compile(r"\bswap (\d+) ms\b")
SWAP_STEPS = 12
"""The steps the swap test watches: the pod is deleted after step 5, and the 6 or more steps after it
each swap every worker to a new version."""
SWAP_STALL_S = 60.0
"""The most one suspend -> swap -> commit -> resume fence may take with the pod deleted: placement lets
go of a worker whose agent went silent (10 s) or stays unreachable (15 s); before that it waited out
the swap's deadline (300 s) with the scheduler suspended. A swap on the live pod takes about 1 s."""


@pytest.mark.timeout(TRAIN_TIMEOUT_S + 900)
def test_a_job_re_created_from_a_url_fills_every_dashboard_and_its_inference_pod_deleted_mid_swap_comes_back(
    cluster: kwok.DevCluster, prometheus: prometheus_server.PrometheusServer
) -> None:
    """The faults test's job re-created under its name (``REUSED_NAME``), reading its rows from a URL
    served by a pod of the namespace. The versions the first job left in the node's local weight
    store (a hostPath the operator cannot clear) are under the first job's uid, and this one trains
    from version 0: POLICY never runs ahead of STEP (before, it published after the newest of them and
    the job stalled). After 3 steps, every pod of the job is scraped and every query of the training
    dashboards returns data for it (``dashcheck``). From step 5 the trainer commits and every worker
    swaps a version each step; the one inference pod is deleted then (at a moment in that cycle, not
    timed to the swap itself). No fence holds the scheduler suspended for long, the replacement pod
    comes back serving the committed version, and no step trains on tokens staler than the bound."""
    name = REUSED_NAME
    earlier = {d.name for d in (WEIGHTS / "default" / name).glob("*")}
    serve_datasets(cluster)
    # Ready before the job: the feeder reads the URL at start (and would report it unreachable).
    poll(lambda: ready(get(cluster, "pod", "datasets")), "the datasets pod ready", 60)
    apply(cluster, variant(name, URL))
    print(f"{name}: re-created over the versions of {len(earlier)} earlier job(s) of that name")
    began = time.time()
    seen = train(cluster, name, steps=3)[0]
    dashcheck.assert_every_dashboard_has_data(prometheus, name, poll)
    dashcheck.draw_pictures(prometheus, dashcheck.DASHBOARDS, name, began)
    seen += train(cluster, name, steps=5)[0]
    old = ready_pods(cluster, name, "pool")[0]["metadata"]["name"]
    cluster.kubectl("delete", "pod", old, "--wait=false")
    at = int(get(cluster, "rolloutjob", name)["status"]["step"])
    assert at <= SWAP_STEPS - 5, f"the pod was deleted at step {at}: too late for the swaps after it to count"

    def serving() -> tuple[int, int] | None:
        new = [p for p in ready_pods(cluster, name, "pool") if p["metadata"]["name"] != old]
        return serving_committed(cluster, name, new[0]) if new else None

    # vLLM's CPU build restarts in 60-100 s; the agent repairs to the committed version right after.
    served, committed = poll(serving, "the new inference pod serving the committed version", 240)
    assert served == committed >= 4
    seen += train(cluster, name, steps=SWAP_STEPS)[0]
    assert all(policy <= step + 1 for step, policy in seen), seen  # its own versions only
    log = trainer_log(cluster, name)
    staleness = [int(s) for s in re.findall(r"\bstaleness (\d+)", log)]
    alpha = int(variant(name, URL)["spec"]["rollout"]["staleness"])
    assert len(staleness) >= SWAP_STEPS and max(staleness) <= alpha, staleness
    swaps_s = [int(ms) / 1000 for ms in SWAP_LINE.findall(log)]
    print(f"{name}: pod deleted at step {at}; fences (s) {swaps_s}; longest {max(swaps_s):.1f}s")
    assert len(swaps_s) >= SWAP_STEPS and max(swaps_s) <= SWAP_STALL_S, swaps_s
    delete(cluster, name)


def serving_committed(c: kwok.DevCluster, job: str, pod: dict[str, Any]) -> tuple[int, int] | None:
    """(served, committed) once ``pod``'s vLLM serves the version ``job`` committed, else None."""
    try:
        info = httpx.get(f"http://{pod['status']['podIP']}:8080/weight_info", timeout=5).json()
    except httpx.HTTPError:
        return None  # ready, but vLLM answers slowly while its agent loads the version: not yet
    committed = int(get(c, "rolloutjob", job)["status"]["policyVersion"])
    served = agent_service.parse_version(info.get("weight_version"))
    return (served, committed) if served == committed else None


def pod_ip(c: kwok.DevCluster, job: str, component: str) -> str:
    def running() -> str | None:
        pods = get(c, "pod", "-l", f"treadle.dev/job={job},treadle.dev/component={component}")["items"]
        return str(pods[0]["status"]["podIP"]) if pods and ready(pods[0]) else None

    return poll(running, f"the {component} pod of {job} ready", 180)


@pytest.mark.timeout(600)
def test_a_jobs_services_and_redis_refuse_callers_without_its_secrets(cluster: kwok.DevCluster) -> None:
    """Issue 18's security must-show on running pods: the job's gRPC and HTTP services, reached on
    their pod IPs, refuse a caller without the job's token (its Secret, which the operator made and
    mounted); the chart's Redis refuses a login without a password, and the job's own user reaches
    only the job's keys. No inference replica, no trainer: the services alone."""
    import redis  # the test's own clients, reached over the bridge

    from treadle import errors
    from treadle.services.buffer import client as buffer_client
    from treadle.services.scheduler import client as scheduler_client

    name = "secured"
    apply(cluster, variant(name, {"path": "/var/lib/treadle/datasets/letters.jsonl"}, pools=0))
    secret = poll(lambda: get(cluster, "secret", f"{name}-auth"), "the job's Secret", 60)
    token, redis_password = (
        base64.b64decode(secret["data"][k]).decode() for k in ("token", "redis-password")
    )
    # docs/SECURITY.md's commands for a trainer outside the job get this token, as written
    block = docblocks.block(ROOT, "external-trainer-token")
    exported = docblocks.run(block, env=tool_env() | {"JOB": name, "NS": "default"}, cwd=ROOT, timeout_s=60)
    assert f"TREADLE_TOKEN={token}\n" in exported[-1].output
    policy = get(cluster, "networkpolicy", f"{name}-network")
    assert policy["spec"]["podSelector"] == {"matchLabels": {"treadle.dev/job": name}}
    scheduler, buffer = pod_ip(cluster, name, "scheduler"), pod_ip(cluster, name, "buffer")
    env, feeder = pod_ip(cluster, name, "env"), pod_ip(cluster, name, "feeder")

    async def calls() -> None:
        anyone = scheduler_client.SchedulerClient(f"{scheduler}:50051")
        forger = buffer_client.BufferClient(f"{buffer}:50053", token="another job's token")
        job_scheduler = scheduler_client.SchedulerClient(f"{scheduler}:50051", token=token)
        job_buffer = buffer_client.BufferClient(f"{buffer}:50053", token=token)
        try:
            with pytest.raises(errors.Unauthenticated):
                await anyone.commit_version(1_000_000_000)
            with pytest.raises(errors.Unauthenticated):
                await forger.stats()
            assert (await job_scheduler.stats()).version == 0  # the forged commit changed nothing
            await job_buffer.stats()  # the buffer pod reads its counters as the job's Redis user
        finally:
            for client in (anyone, forger, job_scheduler, job_buffer):
                await client.aclose()

    asyncio.run(calls())
    with httpx.Client(timeout=10) as http:
        assert http.post(f"http://{env}:8000/v1/sessions", json={}).status_code == 401
        assert http.get(f"http://{feeder}:8003/v1/feeds").status_code == 401
        assert http.get(f"http://{env}:8000/metrics").status_code == 200  # Prometheus needs no token

        # The feeder's submissions reached the scheduler: its own calls carry the job's token.
        def fed() -> bool:
            reply = http.get(f"http://{feeder}:8003/v1/feeds", headers={"authorization": f"Bearer {token}"})
            return reply.status_code == 200 and int(reply.json()[0]["fed"]) > 0

        poll(fed, "the feeder's first submission accepted", 120)

    pod = get(cluster, "pod", "-n", "treadle-system", "-l", "app.kubernetes.io/component=redis")["items"][0]
    host = pod["status"]["podIP"]
    with pytest.raises(redis.exceptions.AuthenticationError):
        redis.Redis(host=host, port=6379, protocol=2).get("x")
    prefix = key_prefix(cluster, name)
    job_user = redis.Redis(host=host, port=6379, username=prefix, password=redis_password, protocol=2)
    try:
        job_user.get(f"treadle:buf:{{{prefix}}}:seen")  # its own keys
        with pytest.raises(redis.exceptions.NoPermissionError):
            job_user.get("treadle:buf:{default/learn}:seen")  # another job's
    finally:
        job_user.close()
    delete(cluster, name)
