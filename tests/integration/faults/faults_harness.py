"""The fault suite's harness: a local stack on real processes (Redis with its AOF on disk, every
service, SIMULATED engines), one component SIGKILLed mid-run and started again on its port, and
the accounting that says whether anything was lost or done twice.

Reusable for any component the stack names (``Stack.procs``): a new case is one ``Fault`` row. A
killed scheduler takes its run's accounting with it, so its case is judged by the buffer
(``check_taken_up_after_restart``) instead of the scheduler's totals (``check_exactly_once``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from treadle.api import v1alpha1
from treadle.localmode import plan as plan_mod
from treadle.localmode import run as run_mod
from treadle.localmode import stack as stack_mod
from treadle.services.buffer import client as buffer_client
from treadle.services.scheduler import client as scheduler_client
from treadle.testing import procs
from treadle.v1 import buffer_pb2, scheduler_pb2

GROUP_SIZE = 4
STALE = "stale: "
"""The reason of a trajectory aborted because the trainer moved more than ``staleness`` versions on."""


@dataclasses.dataclass(frozen=True)
class Fault:
    process: str
    """The stack's name for it: ``redis``, ``buffer``, ``placement``, ``env-0``, ``reward``, ..."""
    after_turns: int = 12
    """Killed once the scheduler has run this many turns (mid-run: work is in every stage)."""
    down_s: float = 1.0
    """Seconds it stays dead before it is started again."""


@dataclasses.dataclass
class Outcome:
    summary: dict[str, Any]
    buffer: buffer_pb2.BufferStats
    completed_at_restart: int
    restarted: bool
    trained: list[str]
    """The id of every row the trainer acked, across its restarts, in order."""
    trained_at_restart: int


def job(*, max_turns: int = 4, batch_size: int = 8) -> v1alpha1.RolloutJob:
    return v1alpha1.parse_job({
        "apiVersion": "treadle.dev/v1alpha1", "kind": "RolloutJob", "metadata": {"name": "faults"},
        "spec": {
            "agents": [{"name": "solver", "model": "tiny"}],
            "pools": [{"name": "decode", "agent": "solver", "accelerator": "H20", "replicas": 1,
                       "preferredWork": "decode-heavy"}],
            "tasks": [{"name": "math", "agents": ["solver"], "environment": "math-tool", "reward": "math",
                       "affinity": "decode-heavy", "groupSize": GROUP_SIZE, "maxTurns": max_turns}],
            "rollout": {"batchSize": batch_size, "staleness": 1},
        },
    })  # fmt: skip


async def start_redis(stack: stack_mod.Stack) -> str:
    """Redis as the chart runs it (AOF, fsync every second, noeviction), its files in the run dir."""
    binary = procs.which("redis-server", "apt-get install redis-server, or run hack/setup.sh")
    data = stack.run_dir / "redis"
    data.mkdir(exist_ok=True)
    port = procs.free_port()
    argv = [
        binary, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "yes",
        "--appendfsync", "everysec", "--dir", str(data), "--maxmemory", "256mb",
        "--maxmemory-policy", "noeviction", "--daemonize", "no",
    ]  # fmt: skip
    await stack.launch("redis", argv, port=port, kind="tcp")
    return f"redis://127.0.0.1:{port}/0"


async def run_with_fault(
    run_dir: Path, fault: Fault, *, trajectories: int = 32, timeout_s: float = 120.0
) -> Outcome:
    """Run ``trajectories`` through a fresh stack, killing and restarting ``fault.process`` once."""
    # Eight in flight at 10 ms a token: the run lasts several seconds, so a kill lands mid-run and work
    # is left to do after the restart.
    options = plan_mod.Options(
        trajectories=trajectories, max_workers_per_pool=1, env_servers=1, max_tokens=32, max_in_flight=8,
        engine_step_ms=10.0,
    )  # fmt: skip
    plan = plan_mod.make_plan(job(), options)
    marks: dict[str, int] = {}
    with stack_mod.Stack(run_dir) as stack:
        redis_url = await start_redis(stack)
        services = await run_mod.start_services(stack, plan, options, redis_url=redis_url)
        trained = await start_trainer(stack, services, batch_size=plan.config.scheduler.settings.batch_size)
        health = "/health" if fault.process.startswith("engine-") else "/healthz"

        async def maybe_kill(stats: scheduler_pb2.SchedulerStats) -> None:
            if "killed" in marks or stats.turns < fault.after_turns:
                return
            marks["killed"] = stats.turns
            stack.kill(fault.process)
            await asyncio.sleep(fault.down_s)
            await stack.restart(fault.process, health_path=health, timeout_s=60.0)
            marks["completed_at_restart"] = (await _stats(services)).completed
            marks["trained_at_restart"] = len(trained.read_text().split())

        summary = await run_mod.drive(
            services, plan, interval_s=0.2, timeout_s=timeout_s, echo=lambda _: None, on_tick=maybe_kill,
            train=False,
        )  # fmt: skip
        popen = stack.procs[fault.process].popen
        restarted = "killed" in marks and popen is not None and popen.poll() is None
        stack.kill("trainer")  # before the buffer's counts are read: it acks nothing after them
        buffer = buffer_client.BufferClient(services.buffer, token=services.token)
        try:
            stored = await buffer.stats()
        finally:
            await buffer.aclose()
        return Outcome(
            summary=summary, buffer=stored, completed_at_restart=marks.get("completed_at_restart", -1),
            restarted=restarted,
            trained=trained.read_text().split(), trained_at_restart=marks.get("trained_at_restart", -1),
        )  # fmt: skip


async def start_trainer(stack: stack_mod.Stack, services: run_mod.Services, *, batch_size: int) -> Path:
    """The simulated trainer as the stack's process ``trainer``; returns the file of the rows it acked."""
    trained = stack.run_dir / "trained.txt"
    trained.touch()
    addresses = {
        "scheduler": services.scheduler, "placement": services.placement, "buffer": services.buffer,
        "agents": services.agents, "engines": services.engines, "token": services.token,
    }  # fmt: skip
    port = procs.free_port()
    argv = [
        sys.executable, str(Path(__file__).with_name("trainer_proc.py")), "--port", str(port),
        "--services", json.dumps(addresses), "--batch-size", str(batch_size), "--trained", str(trained),
    ]  # fmt: skip
    await stack.launch("trainer", argv, port=port, kind="tcp")
    return trained


async def _stats(services: run_mod.Services) -> scheduler_pb2.SchedulerStats:
    scheduler = scheduler_client.SchedulerClient(services.scheduler, token=services.token)
    try:
        return await scheduler.stats()
    finally:
        await scheduler.aclose()


def check_exactly_once(out: Outcome, *, trajectories: int, may_fail: tuple[str, ...] = ()) -> None:
    """Every submitted trajectory finished once, was stored once and trained at most once.

    ``may_fail``: the stages whose failures the fault may cause (counted, with their reason); any
    other failure, an unfinished trajectory or a row trained twice fails the test. Aborts for
    staleness (the simulated trainer commits faster than rollouts finish) are the run's own, counted
    like the rest.
    """
    s = out.summary
    assert out.restarted, "the component was never killed and restarted: the test proves nothing"
    assert s["submitted"] == trajectories and s["unfinished"] == 0 and s["adds_up"], s
    assert s["completed"] + s["failed"] + s["aborted"] == trajectories, s
    assert s["completed"] > out.completed_at_restart, f"nothing completed after the restart: {s}"
    assert len(out.trained) > out.trained_at_restart, f"nothing trained after the restart: {out.trained}"
    wrong = [r for r in s["failed_by_reason"] if not r.startswith((*may_fail, STALE))]
    assert not wrong, f"failures the fault should not cause: {s['failed_by_reason']}"
    # Stored exactly once: the buffer counted every trajectory once (a retried put is a duplicate).
    stored = (out.buffer.put, out.buffer.completed, out.buffer.failed, out.buffer.aborted)
    assert stored == (trajectories, s["completed"], s["failed"], s["aborted"]), out.buffer
    twice = sorted({tid for tid in out.trained if out.trained.count(tid) > 1})
    assert not twice, f"trained twice: {twice}"
    # Each stored row was acked by the trainer, is still stored, was evicted as stale or retired with a
    # group none of whose members completed: none vanished. The buffer's counts, read after the
    # trainer stopped (its own log can miss an ack it sent as it was cancelled).
    b = out.buffer
    assert b.acked + b.stored + b.evicted + b.retired_empty_groups * GROUP_SIZE == trajectories, b


def check_taken_up_after_restart(out: Outcome, *, trajectories: int) -> None:
    """After a scheduler restart: the new scheduler finished what it took up from its journal, and the
    buffer (whose totals outlive both schedulers) stored every submitted trajectory exactly once; no row
    was trained twice and none vanished."""
    s, b = out.summary, out.buffer
    assert out.restarted, "the scheduler was never killed and restarted: the test proves nothing"
    assert s["submitted"] > 0, f"the new scheduler took up nothing from its journal: {s}"
    assert s["unfinished"] == 0 and s["adds_up"], s
    assert s["completed"] > 0, f"nothing completed after the restart: {s}"
    assert len(out.trained) > out.trained_at_restart, f"nothing trained after the restart: {out.trained}"
    assert b.put == trajectories, f"stored {b.put} distinct trajectories of {trajectories}: {b}"
    assert b.completed + b.failed + b.aborted == trajectories, b
    wrong = [r for r in b.failed_by_reason if not r.startswith(STALE)]
    assert not wrong, f"failures the restart should not cause: {dict(b.failed_by_reason)}"
    twice = sorted({tid for tid in out.trained if out.trained.count(tid) > 1})
    assert not twice, f"trained twice: {twice}"
    assert b.acked + b.stored + b.evicted + b.retired_empty_groups * GROUP_SIZE == trajectories, b
