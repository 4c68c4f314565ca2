"""``treadle train``: the local stack plus the reference GRPO trainer, closing the loop on the toy task.

Called by ``treadle.trainer.cli`` and the integration and slow tests. Every service is a process on
127.0.0.1 (``treadle.localmode.stack.Stack``): per worker an engine (real vLLM on CPU with the
weights worker extension, or the simulated engine for the fast tier) and its inference agent; one
``math-tool`` environment server (its question is the prompt; one turn); the reward gateway
allowed to import ``treadle.trainer`` (the toy reward ``py:treadle.trainer.toy:score``); buffer;
placement; scheduler. Weights go to the local file backend of ``treadle.weights`` under the run
directory. A feeder keeps about two batches of prompt groups queued at the scheduler, and
``loop.Trainer`` runs the iterations. The summary accounts for every trajectory.

The toy task is a RolloutJob (``toy_job``) whose job file every service reads, as in a pod; flags
give addresses, the scheduler's counts and the toy's instruction (a system prompt, which a RolloutJob
has no field for). Why not ``treadle run FILE``: local mode starts only the simulated engine and a
reward gateway with no user modules. The wiring below mirrors
``treadle.localmode.run.start_services`` otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from treadle import auth, errors
from treadle.api import env_vars, v1alpha1
from treadle.client import batches as batches_mod
from treadle.client import publisher as publisher_mod
from treadle.localmode import run as localmode_run
from treadle.localmode import stack as stack_mod
from treadle.services import podenv
from treadle.services.buffer import client as buffer_client
from treadle.services.placement import client as placement_client
from treadle.services.scheduler import client as scheduler_client
from treadle.trainer import engines, group, loop, parallel, policy, step, toy
from treadle.v1 import placement_pb2, scheduler_pb2
from treadle.weights import objects, publish

log = logging.getLogger(__name__)
TASK = "toy-letter"
AGENT = "default"
POOL = "cpu"
PREFIX = "local/toy-letter"
Engine = Literal["vllm", "simulated"]


@dataclasses.dataclass(frozen=True)
class Options:
    engine: Engine = "vllm"
    workers: int = 1
    steps: int = 20
    groups_per_step: int = 4
    group_size: int = 8
    max_tokens: int = 12
    alpha: int = 1
    lr: float = 3e-3
    seed: int = 0
    model_seed: int = 0
    model_arch: str = "llama"
    """The tiny model's architecture (``treadle.models.tiny.ARCHS``): ``llama`` or ``qwen3``."""
    max_in_flight: int = 64

    def __post_init__(self) -> None:
        if self.engine not in ("vllm", "simulated"):
            raise errors.SpecError("must be vllm or simulated", field="engine", value=self.engine)
        if self.model_arch not in ("llama", "qwen3"):
            raise errors.SpecError("must be llama or qwen3", field="model_arch", value=self.model_arch)
        for name in ("workers", "steps", "groups_per_step", "group_size", "max_tokens", "max_in_flight"):
            if getattr(self, name) < 1:
                raise errors.SpecError("must be >= 1", field=name, value=getattr(self, name))
        if self.alpha < 0:
            raise errors.SpecError("must be >= 0", field="alpha", value=self.alpha)

    @property
    def batch_size(self) -> int:
        return self.groups_per_step * self.group_size


def toy_job(options: Options, model_dir: Path) -> v1alpha1.RolloutJob:
    """The toy task as a RolloutJob: one turn of ``math-tool`` scored by the toy's ``py:`` reward."""
    return v1alpha1.parse_job({
        "apiVersion": v1alpha1.API_VERSION, "kind": v1alpha1.KIND, "metadata": {"name": TASK},
        "spec": {
            "agents": [{"name": AGENT, "model": str(model_dir), "maxModelLen": 1024}],
            # The accelerator is a placeholder: the engines run on this machine's CPU.
            "pools": [{"name": POOL, "agent": AGENT, "accelerator": "H100", "replicas": options.workers}],
            "tasks": [{"name": TASK, "agents": [AGENT], "environment": "math-tool", "reward": toy.REWARD,
                       "groupSize": options.group_size, "maxTurns": 1}],
            # The local gateway is up before the first trajectory: no cold start to wait out.
            "reward": {"scaleToZero": False, "minReplicas": 1},
            "rollout": {"batchSize": options.batch_size, "staleness": options.alpha},
        },
    })  # fmt: skip


async def start_services(
    stack: stack_mod.Stack, options: Options, *, model_dir: Path, weights_dir: Path
) -> tuple[localmode_run.Services, list[engines.Replica]]:
    engine_urls: dict[str, str] = {}
    agent_urls: dict[str, str] = {}
    token = auth.new_token()  # the run's, as local mode's (every service requires it)
    job = podenv.job_env(toy_job(options, model_dir), stack.run_dir, token=token)
    for i in range(options.workers):
        worker = f"{POOL}-{i}"
        if options.engine == "vllm":
            args = [
                "--model",
                str(model_dir),
                "--weights-dir",
                str(weights_dir),
                "--weights-prefix",
                PREFIX,
                "--cache-dir",
                str(stack.run_dir / "vllm-cache"),
                "--max-num-seqs",
                str(min(options.max_in_flight, 64)),
            ]
            eng = await stack.start(
                f"engine-{worker}",
                "treadle.trainer.vllm_server",
                args,
                kind="http",
                health_path="/health",
                timeout_s=600.0,
            )
        else:
            eng = await stack.start(
                f"engine-{worker}",
                "treadle.services.fakevllm",
                ["--max-model-len", "1024"],
                kind="http",
                health_path="/health",
            )
        engine_urls[worker] = eng.url
        agent = await stack.start(
            f"agent-{worker}",
            "treadle.services.agent",
            ["--engine-url", eng.url, "--worker-id", worker, "--poll-interval-s", "0.2"],
            kind="http",
            env={env_vars.TOKEN_FILE: job[env_vars.TOKEN_FILE]},
        )
        agent_urls[worker] = agent.url
    env = (await stack.start("env-0", "treadle.services.env", [], kind="http", env=job)).url
    reward = (
        await stack.start(
            "reward",
            "treadle.services.reward",
            ["--allow-user-module", "treadle.trainer"],
            kind="http",
            env=job,
        )
    ).url
    metrics: dict[str, str] = {}
    buffer = await _grpc(stack, "buffer", "treadle.services.buffer", ["--namespace", "toy-letter"], job)
    placement = await _grpc(stack, "placement", "treadle.services.placement", [], job)
    scheduler = await _grpc(
        stack,
        "scheduler",
        "treadle.services.scheduler",
        [
            "--max-tokens",
            str(options.max_tokens),
            "--max-in-flight",
            str(options.max_in_flight),
            # A trajectory generates one turn at a time: the in-flight window bounds generations too.
            "--max-concurrent-generations",
            str(options.max_in_flight),
            "--system-prompt",
            toy.PROMPT,
            "--reward-url",
            reward,
            "--placement",
            placement,
            "--buffer",
            buffer,
            "--env-url",
            env,
        ],
        job,
    )
    client = placement_client.PlacementClient(placement, token=token)
    try:
        for worker, url in agent_urls.items():
            await client.register_worker(placement_pb2.Worker(worker_id=worker, pool=POOL, address=url))
    finally:
        await client.aclose()
    services = localmode_run.Services(
        scheduler=scheduler,
        placement=placement,
        buffer=buffer,
        reward=reward,
        envs=[env],
        agents=agent_urls,
        engines=engine_urls,
        metrics=metrics,
        token=token,
    )
    replicas = [engines.Replica(w, engine_urls[w], agent_urls[w]) for w in engine_urls]
    return services, replicas


async def _grpc(stack: stack_mod.Stack, name: str, module: str, args: list[str], env: dict[str, str]) -> str:
    return (await stack.start(name, module, args, kind="grpc", env=env)).address


async def feed(
    scheduler: scheduler_client.SchedulerClient, options: Options, *, interval_s: float = 0.2
) -> int:
    """Keep about two batches of trajectories queued until cancelled; returns groups submitted."""
    submitted = 0
    try:
        while True:
            stats = await scheduler.stats()
            if stats.pending < 2 * options.batch_size:
                groups = [
                    scheduler_pb2.PromptGroup(
                        group_id=f"{TASK}-{submitted + g}",
                        task=TASK,
                        seed=options.seed * 1_000_003 + submitted + g,
                    )
                    for g in range(options.groups_per_step)
                ]
                await scheduler.submit(groups)
                submitted += len(groups)
            await asyncio.sleep(interval_s)
    except asyncio.CancelledError:
        return submitted


async def run(
    options: Options, *, run_dir: Path, echo: Callable[[str], None] = print, timeout_s: float = 1800.0
) -> dict[str, Any]:
    """Start everything, train ``options.steps`` steps, stop everything; returns the summary."""
    began = time.monotonic()
    model_dir = await asyncio.to_thread(
        policy.ensure_model,
        policy.model_dir(options.model_seed, arch=options.model_arch),
        seed=options.model_seed,
        arch=options.model_arch,
    )
    weights_dir = run_dir / "weights"
    weights_dir.mkdir(parents=True, exist_ok=True)
    label = "REAL vLLM (CPU)" if options.engine == "vllm" else "SIMULATED ENGINE (no learning expected)"
    echo(
        f"[treadle train] engine: {label}; model {model_dir}; {options.steps} steps of "
        f"{options.batch_size} trajectories; alpha {options.alpha}; logs in {run_dir}"
    )
    pol = await asyncio.to_thread(policy.load, model_dir)
    with stack_mod.Stack(run_dir) as stack:
        services, replicas = await start_services(
            stack, options, model_dir=model_dir, weights_dir=weights_dir
        )
        echo(f"[treadle train] {len(stack.procs)} processes healthy after {time.monotonic() - began:.1f}s")
        # A service that dies (killed, out of memory) ends the run at once, named (stack.ServiceExited):
        # the trainer would otherwise wait out its batch timeout on a buffer that is gone.
        summary = await asyncio.wait_for(
            stack.unless_one_exits(train(services, replicas, pol, options, weights_dir, echo=echo)),
            timeout=timeout_s,
        )
    summary["seconds_total"] = round(time.monotonic() - began, 1)
    summary["engine"] = options.engine
    summary["run_dir"] = str(run_dir)
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True))
    echo(
        f"[treadle train] mean reward {summary['first_reward']:.3f} (step 1) -> {summary['last_reward']:.3f} "
        f"(step {len(summary['steps'])}); versions committed {summary['committed']}; max staleness "
        f"{summary['staleness_max']} (alpha {options.alpha}); trajectories add up: {summary['adds_up']}; "
        f"{summary['seconds_total']}s in all; summary in {run_dir}/summary.json"
    )
    return summary


async def train(
    services: localmode_run.Services,
    replicas: list[engines.Replica],
    pol: policy.Policy,
    options: Options,
    weights_dir: Path,
    *,
    echo: Callable[[str], None] = print,
) -> dict[str, Any]:
    """The trainer against a started stack; returns the summary (also used by tests on their own stack)."""
    scheduler = scheduler_client.SchedulerClient(services.scheduler, token=services.token)
    buffer = buffer_client.BufferClient(services.buffer, token=services.token)
    store = objects.FileStore(weights_dir)
    weights = publish.Publisher(store, PREFIX, bucket_bytes=1 << 20, staleness_window=options.alpha + 1)
    publisher = publisher_mod.Publisher(weights, committer=scheduler)
    batches = batches_mod.Batches(
        buffer,
        batch_size=options.batch_size,
        version=lambda: publisher.committed,
        timeout_s=300.0,
        max_batches=options.steps,
        acks="explicit",
    )
    swapper = engines.EngineSwapper(replicas, extension=options.engine == "vllm", token=services.token)
    world = parallel.init({})  # one rank: the same FSDP2 path as a trainer pod's
    parallel.shard(pol.model, world, bf16=False, checkpointing=False)
    trainer = loop.Trainer(
        group.Group(world, pol, lr=options.lr, settings=step.Settings(), weights=weights),
        batches=batches,
        publisher=publisher,
        gate=scheduler,
        swapper=swapper,
        config=loop.Config(steps=options.steps, batch_size=options.batch_size),
        echo=echo,
    )
    background = [
        asyncio.create_task(feed(scheduler, options), name="feeder"),
        asyncio.create_task(localmode_run.report_loads(services), name="load reporter"),
    ]
    try:
        history = await trainer.run()
    finally:
        parallel.close()
        background[0].cancel()
        fed = await asyncio.gather(background[0], return_exceptions=True)
        background[1].cancel()
        await asyncio.gather(background[1], return_exceptions=True)
    # Close the books: admit nothing new, let in-flight trajectories land, then count.
    await scheduler.suspend()
    stats = await _settle(scheduler)
    buffer_stats = await buffer.stats()
    await scheduler.aclose()
    await buffer.aclose()
    weights.store.close()
    rewards = [r.mean_reward for r in history]
    finished = stats.completed + stats.failed + stats.aborted
    return {
        "steps": [dataclasses.asdict(r) for r in history],
        "first_reward": rewards[0] if rewards else 0.0,
        "last_reward": rewards[-1] if rewards else 0.0,
        "committed": publisher.committed,
        "served": dict(swapper.served),
        "staleness_max": max((r.staleness for r in history), default=0),
        "groups_submitted": fed[0] if isinstance(fed[0], int) else None,
        "submitted": stats.submitted,
        "completed": stats.completed,
        "failed": stats.failed,
        "aborted": stats.aborted,
        "pending": stats.pending,
        "in_flight": stats.in_flight,
        "adds_up": stats.submitted == stats.pending + stats.in_flight + stats.unsaved + finished,
        "trained": sum(r.samples for r in history),
        "buffer": {
            "put": buffer_stats.put,
            "stored": buffer_stats.stored,
            "delivered": buffer_stats.delivered,
            "acked": buffer_stats.acked,
            "evicted": buffer_stats.evicted,
            "redelivered": buffer_stats.redelivered,
        },
    }


async def _settle(scheduler: scheduler_client.SchedulerClient, *, timeout_s: float = 30.0) -> Any:
    """Scheduler stats once every finished trajectory is saved to the buffer (or ``timeout_s`` passed).

    The scheduler is suspended by then, which also holds in-flight trajectories at their next turn,
    so they stay counted as in flight rather than being waited for.
    """
    deadline = time.monotonic() + timeout_s
    stats = await scheduler.stats()
    while stats.unsaved and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
        stats = await scheduler.stats()
    return stats


def default_run_dir() -> Path:
    base = localmode_run.default_run_dir("train-toy-letter")
    with contextlib.suppress(OSError):
        base.parent.mkdir(parents=True, exist_ok=True)
    return base
