"""``treadle run FILE``: a whole RolloutJob on this machine, every service a process on 127.0.0.1.

Called by ``treadle.localmode.cli`` and by the integration tests (``start_services`` alone, to
crash parts of a live stack). The order of a run:

1. ``plan.make_plan`` decides what only local mode decides (workers, groups, the scheduler's counts).
2. ``start_services``: the job topology's processes (``treadle.topology``, as the operator renders
   them into pods; ``launches``): the reward gateway; per worker a SIMULATED vLLM engine
   (``treadle.services.fakevllm``) and its inference agent; the environment servers; the buffer
   (embedded memory store, or Redis with ``--redis``); placement; the scheduler. Each reads the job
   from ``<run dir>/job.json`` (``TREADLE_CONFIG``), as a pod reads its ConfigMap, and the others'
   addresses from the same ``TREADLE_*`` variables as a pod; flags give only local mode's own counts
   and ports (``launches.deployment``). Workers are registered with placement and
   a load reporter forwards each agent's ``/v1/load`` to placement (in a cluster the agent would).
3. The prompt groups are submitted; a SIMULATED TRAINER (no gradient step) runs RollArt's loop:
   ``get_batch`` -> suspend -> bump the engines' weight version -> ``commit_version`` -> resume ->
   ``ack``, so admission, staleness eviction and version tags are exercised for real.
4. A progress line per interval, and the summary (also written to ``<run dir>/summary.json``).

The engine is always the simulated one here and every line printed says so: real vLLM on CPU runs in
the slow test tier, not (yet) in local mode.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from treadle import auth, errors
from treadle.api import env_vars, v1alpha1
from treadle.localmode import launches as launches_mod
from treadle.localmode import plan as plan_mod
from treadle.localmode import stack as stack_mod
from treadle.localmode import trainer as trainer_mod
from treadle.services import podenv
from treadle.services.agent import client as agent_client
from treadle.services.buffer import client as buffer_client
from treadle.services.placement import client as placement_client
from treadle.services.reward import protocol as reward_protocol
from treadle.services.scheduler import client as scheduler_client
from treadle.testing import procs
from treadle.v1 import placement_pb2, scheduler_pb2

log = logging.getLogger(__name__)
LABEL = "SIMULATED ENGINE"
STAGES = ("generation", "environment", "reward", "waiting")


@dataclasses.dataclass
class Services:
    """Addresses of a started stack."""

    scheduler: str
    placement: str
    buffer: str
    reward: str
    envs: list[str]
    agents: dict[str, str]
    engines: dict[str, str]
    metrics: dict[str, str]
    token: str
    """The run's token (``treadle.auth``): every service requires it, so every client sends it."""
    workers: list[placement_pb2.Worker] = dataclasses.field(default_factory=list)
    """What was registered with placement; registered again when a restarted placement forgot it."""
    reporter: asyncio.Task[None] | None = None
    """``report_loads`` for this stack, started with it: placement lets go of a worker whose load it
    has not heard of for 10 s, so a stack without it stalls once a run outlasts that."""


def job_env(stack: stack_mod.Stack, plan: plan_mod.Plan, token: str) -> dict[str, str]:
    """Write the job file and the run's token into the run directory; ``TREADLE_CONFIG``,
    ``TREADLE_JOB`` and ``TREADLE_TOKEN_FILE`` as a process reads them (for clients of the run).

    Every service reads the job's settings from that file (``treadle.api.jobconfig``), as in a
    cluster. ``token``: the run's own, as the operator mounts the job's Secret.
    """
    return podenv.job_env(plan.job, stack.run_dir, token=token)


async def start_services(
    stack: stack_mod.Stack,
    plan: plan_mod.Plan,
    options: plan_mod.Options,
    *,
    redis_url: str = "",
    report_interval_s: float = 0.5,
) -> Services:
    """Start every process of ``plan`` on ``stack`` (the job topology's, ``launches``), register the
    workers with placement and start forwarding their load to it every ``report_interval_s``
    (``Services.reporter``)."""
    token = auth.new_token()
    env = job_env(stack, plan, token)
    if plan.config.env.api_quotas and not redis_url:
        raise errors.SpecError(
            f"the job's API quotas ({sorted(plan.config.env.api_quotas)}) are kept in Redis for all env"
            " servers: pass --redis", field="--redis",
        )  # fmt: skip
    ports = launches_mod.allocate(plan, options, procs.free_port)
    where = launches_mod.site(plan, options, ports, env[env_vars.CONFIG])
    local_env = launches_mod.run_env(token_file=env[env_vars.TOKEN_FILE], redis_url=redis_url)
    started: dict[str, stack_mod.Proc] = {}
    for launch in launches_mod.launches(plan, options, where, ports, local_env=local_env):
        started[launch.name] = await stack.launch(
            launch.name, launch.argv(stack.python), port=launch.port, kind=launch.kind, env=launch.environ,
            health_path=launch.health_path,
        )  # fmt: skip
        if launch.component == "reward":  # a job naming a function it does not serve fails before the rest
            await _check_reward_functions(launch.url, plan, token)
    engines = {w.worker_id: started[f"engine-{w.worker_id}"].url for w in plan.workers}
    agents = {w.worker_id: started[f"agent-{w.worker_id}"].url for w in plan.workers}
    grpc = ("buffer", "placement", "scheduler")
    metrics = {name: f"http://127.0.0.1:{ports[f'metrics-{name}']}/metrics" for name in grpc}
    placement = started["placement"].address
    workers = [
        placement_pb2.Worker(
            worker_id=w.worker_id,
            pool=w.pool,
            address=agents[w.worker_id],
            engine_address=engines[w.worker_id],
        )
        for w in plan.workers
    ]
    client = placement_client.PlacementClient(placement, token=token)
    try:
        for worker in workers:
            await client.register_worker(worker)
    finally:
        await client.aclose()
    envs = [started[f"env-{i}"].url for i in range(options.env_servers)]
    services = Services(scheduler=started["scheduler"].address, placement=placement,
                        buffer=started["buffer"].address, reward=started["reward"].url, envs=envs,
                        agents=agents, engines=engines, metrics=metrics, token=token,
                        workers=workers)  # fmt: skip
    # Local mode's agents do not report to placement themselves (a cluster's do): this forwards their
    # load for as long as the caller's loop runs, or until it cancels ``services.reporter``.
    services.reporter = asyncio.create_task(
        report_loads(services, interval_s=report_interval_s), name="load reporter"
    )
    return services


async def _check_reward_functions(reward_url: str, plan: plan_mod.Plan, token: str) -> None:
    async with httpx.AsyncClient(timeout=10.0, headers={auth.HEADER: auth.header_value(token)}) as client:
        known = {f["name"] for f in (await client.get(reward_url + "/v1/functions")).json()}
    if reward_protocol.ANY_FUNCTION in known:  # an external service owns the names
        return
    for i, task in enumerate(plan.config.scheduler.tasks):
        if task.reward_fn not in known and not task.reward_fn.startswith("py:"):
            raise errors.SpecError(
                f"the reward gateway has no function {task.reward_fn!r}; it serves {sorted(known)}",
                field=f"spec.tasks[{i}].reward", value=task.reward_fn,
            )  # fmt: skip


async def report_loads(services: Services, *, interval_s: float = 0.5) -> None:
    """Forward every agent's load to placement until cancelled (the agent's job in a cluster).

    A worker placement does not know (it restarted and forgot its workers) is registered again, as
    an agent's own reporter does in a cluster (``treadle.services.agent.reporter``).
    """
    agents = {
        wid: agent_client.AgentClient(url, timeout_s=5.0, token=services.token)
        for wid, url in services.agents.items()
    }
    registered = {w.worker_id: w for w in services.workers}
    placement = placement_client.PlacementClient(services.placement, token=services.token)
    try:
        while True:
            for wid, agent in agents.items():
                try:
                    load = await agent.load()
                    await placement.report_load(
                        placement_pb2.WorkerLoad(
                            worker_id=wid, running=load.running, waiting=load.waiting,
                            kv_cache_usage=load.kv_cache_usage, policy_version=load.policy_version,
                            healthy=load.healthy,
                        )
                    )  # fmt: skip
                except errors.NotFound as exc:
                    if wid not in registered:
                        raise
                    log.warning("placement forgot worker %s (restarted?); registering it again: %s", wid, exc)
                    with contextlib.suppress(errors.TreadleError, TimeoutError):
                        await placement.register_worker(registered[wid])
                except (errors.TreadleError, TimeoutError) as exc:
                    log.info("load report for %s failed: %s", wid, exc)
            await asyncio.sleep(interval_s)
    finally:
        for agent in agents.values():
            await agent.aclose()
        await placement.aclose()


def progress_line(
    stats: scheduler_pb2.SchedulerStats, *, elapsed: float, total: int, rewards: list[float]
) -> str:
    done = stats.completed + stats.failed + stats.aborted
    stage = dict(stats.stage_seconds)
    spent = sum(stage.values()) or 1.0
    split = " ".join(f"{s[:3]} {100 * stage.get(s, 0.0) / spent:.0f}%" for s in STAGES)
    mean = sum(rewards) / len(rewards) if rewards else 0.0
    return (
        f"[{LABEL}] {elapsed:6.1f}s  done {done}/{total} ({stats.completed} ok, {stats.failed} failed, "
        f"{stats.aborted} aborted)  {done / max(elapsed, 1e-9):.1f} traj/s  in flight {stats.in_flight}  "
        f"pending {stats.pending}  turns {stats.turns}  reward {mean:.3f}  v{stats.version}  [{split}]"
    )


async def collect_results(
    scheduler: scheduler_client.SchedulerClient,
    results: list[scheduler_pb2.TrajectoryResult],
    rewards: list[float],
    *,
    echo: Callable[[str], None] = print,
) -> None:
    """Append every streamed result to ``results`` (completed ones' rewards to ``rewards``) until the
    stream ends; a stream that fails says so on the console (its status code), not by missing results."""
    try:
        async for r in scheduler.results():
            results.append(r)
            if r.status == "completed":
                rewards.append(r.reward)
    except (errors.TreadleError, TimeoutError) as exc:
        code = getattr(exc.__cause__, "code", None)  # the client's AioRpcError
        name = code().name if callable(code) else type(exc).__name__
        echo(f"[{LABEL}] ERROR: the scheduler's results stream failed with {name} after "
             f"{len(results)} results ({exc}); the summary's rewards, tokens and trajectory times "
             f"count only those")  # fmt: skip


async def run(
    job: v1alpha1.RolloutJob,
    options: plan_mod.Options,
    *,
    run_dir: Path,
    redis_url: str = "",
    interval_s: float = 1.0,
    timeout_s: float = 600.0,
    echo: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run the job to the last trajectory (or ``timeout_s``); returns the summary it printed."""
    plan = plan_mod.make_plan(job, options)
    echo(f"[{LABEL}] treadle run {job.name}: {plan.trajectories} trajectories in {len(plan.groups)} groups, "
         f"{len(plan.workers)} simulated workers, logs in {run_dir}")  # fmt: skip
    for pool, replicas in plan.replicas_in_job.items():
        local = sum(1 for w in plan.workers if w.pool == pool)
        echo(f"[{LABEL}] pool {pool}: {replicas} replicas in the job, {local} simulated engines here")
    with stack_mod.Stack(run_dir) as stack:
        began = time.monotonic()
        services = await start_services(stack, plan, options, redis_url=redis_url)
        echo(f"[{LABEL}] {len(stack.procs)} processes healthy in {time.monotonic() - began:.1f}s")
        summary = await drive(services, plan, interval_s=interval_s, timeout_s=timeout_s, echo=echo)
    summary["run_dir"] = str(run_dir)
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True))
    for line in summary_lines(summary):
        echo(line)
    return summary


async def drive(
    services: Services,
    plan: plan_mod.Plan,
    *,
    interval_s: float,
    timeout_s: float,
    echo: Callable[[str], None] = print,
    on_tick: Callable[[scheduler_pb2.SchedulerStats], Any] | None = None,
    train: bool = True,
) -> dict[str, Any]:
    """Submit the plan's groups, run the simulated trainer and report until every trajectory is stored.

    ``train=False``: no trainer here (a test runs it as a process of its own, to kill it)."""
    scheduler = scheduler_client.SchedulerClient(services.scheduler, token=services.token)
    buffer = buffer_client.BufferClient(services.buffer, token=services.token)
    placement = placement_client.PlacementClient(services.placement, token=services.token)
    trainer = trainer_mod.TrainerLog()
    rewards: list[float] = []
    results: list[scheduler_pb2.TrajectoryResult] = []

    background = [
        asyncio.create_task(collect_results(scheduler, results, rewards, echo=echo), name="results"),
    ]
    if train:
        batch_size = plan.config.scheduler.settings.batch_size
        agents = plan.config.buffer.agents
        background.append(
            asyncio.create_task(
                trainer_mod.simulated_trainer(services, batch_size=batch_size, out=trainer, agents=agents),
                name="trainer",
            )
        )
    began = time.monotonic()
    try:
        groups = [scheduler_pb2.PromptGroup(group_id=g, task=t, seed=s) for g, t, s in plan.groups]
        await scheduler.submit(groups)
        while True:
            await asyncio.sleep(interval_s)
            stats = await scheduler.stats()
            elapsed = time.monotonic() - began
            echo(progress_line(stats, elapsed=elapsed, total=stats.submitted, rewards=rewards))
            if on_tick is not None:
                await on_tick(stats)
            if scheduler_client.settled(stats):
                break
            if elapsed > timeout_s:
                unfinished = stats.submitted - stats.completed - stats.failed - stats.aborted
                echo(f"[{LABEL}] timed out after {timeout_s}s; {unfinished} unfinished")
                break
        elapsed = time.monotonic() - began
        stats = await scheduler.stats()
        buffer_stats = await buffer.stats()
        pools = await placement.pool_state()
    finally:
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        await scheduler.aclose()
        await buffer.aclose()
        await placement.aclose()
    return summarize(stats, buffer_stats, trainer, results, elapsed=elapsed, pools=pools)


def summarize(
    stats: scheduler_pb2.SchedulerStats,
    buffer_stats: Any,
    trainer: trainer_mod.TrainerLog,
    results: list[scheduler_pb2.TrajectoryResult],
    *,
    elapsed: float,
    pools: placement_pb2.PoolStateResponse | None = None,
) -> dict[str, Any]:
    done = stats.completed + stats.failed + stats.aborted
    agents = list(pools.agents) if pools is not None else []
    completed = [r for r in results if r.status == "completed"]
    stage = dict(stats.stage_seconds)
    return {
        "engine": LABEL,
        "seconds": round(elapsed, 3),
        "submitted": stats.submitted,
        "completed": stats.completed,
        "failed": stats.failed,
        "aborted": stats.aborted,
        "unfinished": stats.submitted - done,
        "adds_up": stats.submitted == stats.pending + stats.in_flight + stats.unsaved + done,
        "trajectories_per_s": round(done / max(elapsed, 1e-9), 2),
        "turns": stats.turns,
        "mean_turns": round(sum(r.turns for r in completed) / max(1, len(completed)), 3),
        "output_tokens": sum(r.output_tokens for r in results),
        "mean_reward": round(sum(r.reward for r in completed) / max(1, len(completed)), 4),
        "mean_trajectory_seconds": round(sum(r.seconds for r in results) / max(1, len(results)), 3),
        "stage_seconds": {k: round(v, 3) for k, v in stage.items()},
        "env_retries": stats.env_retries,
        "failed_by_reason": dict(stats.failed_by_reason),
        "failure_examples": sorted({r.reason for r in results if r.status != "completed"})[:5],
        "versions_committed": trainer.version,
        "batches_trained": trainer.batches,
        "trajectories_trained": trainer.trajectories,
        "evicted_groups": trainer.evicted_groups,
        "staleness_max": max(trainer.staleness, default=0),
        "trained_twice": len(trainer.trained) - len(set(trainer.trained)),
        "buffer": {
            "stored": buffer_stats.stored,
            "delivered": buffer_stats.delivered,
            "acked": buffer_stats.acked,
            "evicted": buffer_stats.evicted,
            "redelivered": buffer_stats.redelivered,
        },
        "per_task": {
            t.task: {
                "completed": t.completed,
                "failed": t.failed,
                "aborted": t.aborted,
                "mean_reward": round(t.mean_reward, 4),
            }
            for t in stats.tasks
        },
        "turns_by_agent": dict(sorted(stats.turns_by_agent.items())),
        "rebalance_moves": pools.rebalance_moves if pools is not None else 0,
        "agents": {
            a.agent: {"instances": a.instances, "moved_in": a.moved_in, "moved_out": a.moved_out}
            for a in agents
        }
        if len(agents) > 1
        else {},
    }


def summary_lines(s: dict[str, Any]) -> list[str]:
    spent = sum(s["stage_seconds"].values()) or 1.0
    split = ", ".join(f"{k} {v:.1f}s ({100 * v / spent:.0f}%)" for k, v in s["stage_seconds"].items())
    rows = "rows (one per agent and trajectory)" if s.get("agents") else "trajectories"
    lines = [
        f"[{LABEL}] ===== summary (rewards and tokens come from a simulated engine) =====",
        f"[{LABEL}] trajectories: {s['submitted']} submitted, {s['completed']} completed, "
        f"{s['failed']} failed, {s['aborted']} aborted, {s['unfinished']} unfinished; "
        f"stats add up: {s['adds_up']}",
        f"[{LABEL}] throughput: {s['trajectories_per_s']} trajectories/s over {s['seconds']}s; "
        f"{s['turns']} turns ({s['mean_turns']} per completed trajectory), "
        f"{s['output_tokens']} output tokens",
        f"[{LABEL}] mean reward {s['mean_reward']}; mean trajectory time {s['mean_trajectory_seconds']}s",
        f"[{LABEL}] time per stage (summed over trajectories): {split}",
        f"[{LABEL}] simulated trainer: {s['batches_trained']} batches, "
        f"{s['trajectories_trained']} {rows}, "
        f"{s['versions_committed']} versions committed, "
        f"{s['evicted_groups']} groups evicted, "
        f"max staleness {s['staleness_max']}, {s['trained_twice']} trained twice",
        f"[{LABEL}] buffer: {s['buffer']}; env retries {s['env_retries']}",
    ]
    if s.get("agents"):
        per_agent = ", ".join(
            f"{name} {s['turns_by_agent'].get(name, 0)} turns, {a['instances']} workers at the end "
            f"(+{a['moved_in']}/-{a['moved_out']})"
            for name, a in s["agents"].items()
        )
        lines.append(f"[{LABEL}] agents: {per_agent}; {s['rebalance_moves']} workers moved between agents")
    if s["failed_by_reason"]:
        lines.append(f"[{LABEL}] failures by reason: {s['failed_by_reason']}")
        lines += [f"[{LABEL}]   e.g. {reason}" for reason in s["failure_examples"]]
    lines.append(f"[{LABEL}] summary written to {s.get('run_dir', '.')}/summary.json")
    return lines


def default_run_dir(job: str) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = Path(os.environ.get("TREADLE_CACHE", Path.home() / ".cache" / "treadle")) / "runs"
    with contextlib.suppress(OSError):
        base.mkdir(parents=True, exist_ok=True)
    return base / f"{job}-{stamp}"
