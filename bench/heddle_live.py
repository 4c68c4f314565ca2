"""Heddle on the live stack against sticky least-loaded: time to finish a long-tailed rollout step.

SIMULATED ENGINE: the inference engines are ``treadle.services.fakevllm``: continuous batching, a
decode step of ``--step-ms`` plus ``--step-ms-per-seq`` per running sequence (the batch
interference Heddle's placement works against; without it placement has nothing to gain), at most
``--slots`` sequences at once. Everything else is real: every service is its own process on
127.0.0.1 (reward gateway, math-tool environment server, one inference agent per engine, buffer,
placement, scheduler) talking over HTTP and gRPC.

Workload: ``--groups`` prompt groups of ``--group-size``; group ``g`` runs ``turns[g]`` turns (the
environment's ``max_turns`` option; the fake model never answers, so every trajectory runs them
all), drawn once from a lognormal (median ``--median-turns``, sigma ``--sigma``, capped) so a few
trajectories are far longer than the rest, or given with ``--mix`` (``1x32,60x2``: one group of 32
turns, sixty of 2, in an order shuffled by ``--seed``). Every turn generates exactly ``--tokens`` tokens
(``--eos-probability 0``). ``--tool-s`` makes every tool call take that long (SIMULATED latency of a
remote tool, ``bench/heddle_tools.py``: the agentic regime, where a long trajectory's chain of tool
calls is its critical path). At most ``--gate`` turns generate at once (the scheduler's
``max_concurrent_generations``); the default gives every trajectory a slot, so nothing waits in
the gate and the default run measures Heddle's placement against batch interference (the
scheduling policy then only orders turns at the engines' own queues, which never fill); a lower
``--gate`` makes turns wait in the gate, where the scheduling policy orders and preempts them.

Configurations, run one after the other in ONE run on the same engines, agents and environment:

* ``baseline``: placement ``sticky-least-loaded``, scheduling ``fifo`` (a step-centric framework:
  every turn re-queues at the tail).
* ``heddle``: placement ``heddle`` (presorted DP, strict routing, migration at tool calls = re-route
  + re-prefill, which the fake engine does not charge for) and scheduling ``heddle``
  (predicted-remaining priority, re-predicted after every turn by the history predictor, with
  preemption = ABORT + re-issue; the agent drops the aborted turn's tokens, so it is re-generated,
  hence only turns at most ``--preemption-max-progress`` of a typical turn in are victims). As in
  the paper, a turn's re-rank and migration decision (its placement release) run during its tool
  call, off the critical path (the scheduler does this for every configuration).
* ``heddle-sched`` and ``heddle-place``: each half alone, for the ablation; ``heddle-no-preempt``:
  heddle without preemption (``progressive-priority`` is the same ranking without it);
  ``heddle-unbounded``: heddle with Algorithm 1's preemption unbounded (any running turn a victim);
  ``priority-global``: that ranking (no preemption) in the one gate queue with sticky least-loaded
  placement, ``priority-per-worker``: the same in per-worker queues (``Settings.worker_slots`` =
  ``--gate / --engines``), ``heddle-per-worker``: full heddle in per-worker queues.

Each configuration gets fresh buffer, placement and scheduler processes and runs ``--steps``
rollout steps of the same workload (the first warms the predictor, which learns only from
finished trajectories); the step time is submit -> every trajectory stored. Printed: every step
time, the mean of steps 2.. per configuration, its speedup over the baseline, preemptions and
migrations, and the load average per round (the machine is shared: figures move with it). With
``--rounds`` 2 or more, every configuration's ratio to the baseline and to its neighbour without
one mechanism (``heddle_probes.PAIRS``: ordering, preemption, placement + migration), paired per
round with a 95 % t interval on the log ratios, and the engines' own step count and tokens per
step (``vllm:iteration_tokens_total``, which fakevllm exports as vLLM does).

Engine cost (``--cost-model ACCELERATOR:MODEL:CONTEXT``): the per-sequence step cost comes from
``treadle.policy.costmodel.decode_step_line`` (the roofline decode step with every sequence
holding CONTEXT tokens, memory bound: each sequence adds its KV read), scaled so that batch 1 still
takes ``--step-ms``. ``H800:qwen3-14b:16384`` gives 1.852 + 0.148 ms a running sequence (7.4 %
of a step each), the batch interference of a long-context agent on a GPU.

Probes (``--probe-s``, every 0.1 s by default): the placement service's outstanding turns per
worker, and ``ListTrajectories`` (worker, tokens so far, predicted remaining of every in-flight
trajectory); the results stream gives each trajectory's finish time and length. Per warm step and
configuration they print as: time-averaged outstanding turns per worker and their max - min gap,
trajectories and turns per worker (each on the last worker it was seen on), how many of the six
longest ended on the first worker, migrations, when half the trajectories had finished; and the
live predictor's error, |predicted - actual| remaining tokens by turns done (median and MAPE).

Prefill (``--prefill``, off by default): the engines also model prefill and vLLM's automatic
prefix caching (see ``treadle.services.fakevllm.engine``): a turn prefills only the prompt tokens
after its longest prefix cached *on its engine*, at most ``--max-num-batched-tokens`` a step, and
each step is ``--prefill-us-per-token`` longer per prefilled token for every request on that
engine. A trajectory whose turn goes to another engine than its previous turn (sticky least-loaded's
re-balancing, Heddle's migration, which here is a re-route, not a KV transfer) re-prefills its whole
context there. Every engine's cache is reset before each step, as an RL framework does after a
weight update (the fake model would otherwise repeat last step's trajectories token for token and
hit on them). Per step the bench reads the engines' ``vllm:prefix_cache_queries`` / ``_hits``.

The defaults of the three prefill flags are not tuned; they come from ``treadle.policy.costmodel``
(the roofline model the simulator uses) for the model and accelerator of the Heddle benches
(Qwen3-14B on one H800, TP 1, as ``policy_heddle_placement`` and the paper's ablations), scaled by
the bench's own decode step:

* time scale: ``--step-ms`` 2.0 stands for the batch-1 decode step of the cost model,
  ``decode_step_time(H800, QWEN3_14B, batch=1, context 1-2K)`` = 12.58-12.64 ms, so one bench
  millisecond is 6.3 real ones (factor 2.0 / 12.6 = 0.159);
* prefill: ``prefill_time(H800, QWEN3_14B, new_tokens=1000, cached_tokens=1000)`` less the step
  overhead is 61.2 us a token (compute bound: 2 x 14.77e9 FLOPs / (989.5 TFLOP/s x MFU 0.508) =
  58.8 us + attention; 60.4 us for a cold 2,048-token chunk, 63.7 us after 2K cached), so
  ``--prefill-us-per-token`` = 61.2 x 0.159 = 9.7;
* ``--max-num-batched-tokens`` 8192: vLLM V1's default for the OpenAI server on a GPU of 70 GiB or
  more (``vllm/engine/arg_utils.py``);
* ``--prefix-cache-blocks`` 15434: ``kv_capacity_tokens(H800, QWEN3_14B)`` = 246,948 tokens in
  blocks of 16 (the whole KV pool; vLLM keeps freed blocks cached until it needs them).

Limits of this model: a step's cost is additive in its prefill tokens, so a short suffix (a turn's
~150 new tokens) is charged 1.5 ms of bench time although on the GPU a chunk under ~200 tokens
hides under the decode step's weight read (roofline); the charge is the same in every
configuration. The bench's ``--step-ms-per-seq`` 0.2 (10 % of a step per running sequence) is far
above the cost model's KV-read cost (about 0.06 ms of 12.6 per sequence at 1K tokens): the bench
exaggerates batch interference, which is what Heddle's placement works against.

Run: ``PYTHONPATH=. python bench/heddle_live.py [--out DIR]``; results in ``DIR/results.json``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import math
import os
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import benchcli
import heddle_probes
import heddle_tools

from treadle.api import v1alpha1
from treadle.localmode import run as run_mod
from treadle.localmode import stack as stack_mod
from treadle.policy import costmodel
from treadle.services import podenv
from treadle.services.placement import client as placement_client
from treadle.services.scheduler import client as scheduler_client
from treadle.v1 import placement_pb2, scheduler_pb2

CONFIGS: dict[str, dict[str, str]] = {
    "baseline": {"placement": "sticky-least-loaded", "scheduling": "fifo"},
    "heddle": {"placement": "heddle", "scheduling": "heddle"},
    "heddle-sched": {"placement": "sticky-least-loaded", "scheduling": "heddle"},
    "heddle-place": {"placement": "heddle", "scheduling": "fifo"},
    "heddle-no-preempt": {"placement": "heddle", "scheduling": "progressive-priority"},
    # Algorithm 1 with no bound on the work a preemption throws away (the previous default)
    "heddle-unbounded": {"placement": "heddle", "scheduling": "heddle", "max_progress": "inf"},
    # Heddle (bounded preemption) in per-worker queues of --gate / --engines slots each, as the paper
    # reorders each rollout worker's queue (Settings.worker_slots)
    "heddle-per-worker": {"placement": "heddle", "scheduling": "heddle", "per_worker": "yes"},
    # Heddle's ranking, one queue for all workers, sticky least-loaded placement
    "priority-global": {"placement": "sticky-least-loaded", "scheduling": "progressive-priority"},
    # Heddle's ranking in per-worker queues of --gate / --engines slots each (Settings.worker_slots)
    "priority-per-worker": {
        "placement": "sticky-least-loaded",
        "scheduling": "progressive-priority",
        "per_worker": "yes",
    },
}


@dataclasses.dataclass(frozen=True)
class Config:
    groups: int = dataclasses.field(default=32, metadata={"help": "prompt groups per rollout step"})
    group_size: int = dataclasses.field(default=2, metadata={"help": "trajectories per prompt group"})
    engines: int = dataclasses.field(
        default=2, metadata={"help": "simulated engines (fakevllm), one inference agent each"}
    )
    slots: int = dataclasses.field(
        default=64, metadata={"help": "running sequences per engine (--max-num-seqs)"}
    )
    gate: int = dataclasses.field(
        default=64,
        metadata={"help": "turns generating at once over all workers (Settings.max_concurrent_generations)"},
    )
    step_ms: float = dataclasses.field(
        default=2.0, metadata={"help": "decode step of an engine, milliseconds"}
    )
    step_ms_per_seq: float = dataclasses.field(
        default=0.2,
        metadata={"help": "added to a decode step per running sequence (batch interference), milliseconds"},
    )
    cost_model: str = dataclasses.field(
        default="",
        metadata={
            "help": "ACCELERATOR:MODEL:CONTEXT (e.g. H800:qwen3-14b:16384): the per-sequence step cost from "
            "treadle.policy.costmodel's decode step at CONTEXT tokens a sequence, scaled so that batch 1 "
            "takes --step-ms; replaces --step-ms-per-seq (module doc)"
        },
    )
    tokens: int = dataclasses.field(default=32, metadata={"help": "tokens every turn generates"})
    tool_s: float = dataclasses.field(
        default=0.0,
        metadata={
            "help": "every tool call takes this many seconds (SIMULATED latency of a remote tool, "
            "bench/heddle_tools.py; 0: math-tool's own, milliseconds)"
        },
    )
    median_turns: float = dataclasses.field(
        default=2.0, metadata={"help": "median turns per group (lognormal)"}
    )
    sigma: float = dataclasses.field(default=1.3, metadata={"help": "sigma of the lognormal turns per group"})
    max_turns: int = dataclasses.field(default=48, metadata={"help": "cap on turns per group"})
    mix: str = dataclasses.field(
        default="",
        metadata={
            "help": "COUNTxTURNS,... (e.g. 1x32,60x2): that many groups of that many turns, shuffled by "
            "--seed, instead of --groups lognormal ones"
        },
    )
    steps: int = dataclasses.field(
        default=3, metadata={"help": "rollout steps per configuration (the first warms the predictor)"}
    )
    seed: int = dataclasses.field(default=0, metadata={"help": "seed of the workload"})
    step_timeout_s: float = dataclasses.field(
        default=300.0, metadata={"help": "a step not done in this many seconds fails the run"}
    )
    preemption_margin: float = dataclasses.field(
        default=0.0, metadata={"help": "Settings.preemption_margin of the preemptive configurations"}
    )
    preemption_max_progress: float = dataclasses.field(
        default=0.25,
        metadata={
            "help": "Settings.preemption_max_progress of the preemptive configurations but heddle-unbounded"
        },
    )
    configs: str = dataclasses.field(
        default=",".join(CONFIGS),
        metadata={"help": "comma-separated configurations to run (see the module doc)"},
    )
    rounds: int = dataclasses.field(
        default=1,
        metadata={
            "help": "each configuration runs once per round (fresh processes); the order alternates per round"
        },
    )
    probe_s: float = dataclasses.field(
        default=0.1,
        metadata={
            "help": "sample per-worker load, predictions and workers this often during a step (0: not at all)"
        },
    )
    out: str = dataclasses.field(
        default="", metadata={"help": "directory for results.json (empty: a new temporary one)"}
    )
    prefill: bool = dataclasses.field(
        default=False,
        metadata={"help": "engines model prefill and prefix caching with the three flags below (doc)"},
    )
    prefill_us_per_token: float = dataclasses.field(
        default=9.7,
        metadata={"help": "with --prefill: a step is this much longer per prompt token it prefills, us"},
    )
    max_num_batched_tokens: int = dataclasses.field(
        default=8192, metadata={"help": "with --prefill: tokens one engine step processes at most"}
    )
    prefix_cache_blocks: int = dataclasses.field(
        default=15434, metadata={"help": "with --prefill: prefix cache capacity per engine, blocks of 16"}
    )


def workload(cfg: Config) -> list[int]:
    """Turns per group, the same in every step and configuration: ``--mix``, or lognormal and capped."""
    rng = random.Random(cfg.seed)
    if cfg.mix:
        turns = parse_mix(cfg.mix, cfg.max_turns)
        rng.shuffle(turns)  # submission order is FIFO's order: the long groups are not first by design
        return turns
    return [
        max(1, min(cfg.max_turns, round(cfg.median_turns * math.exp(rng.gauss(0.0, cfg.sigma)))))
        for _ in range(cfg.groups)
    ]


def parse_mix(mix: str, max_turns: int) -> list[int]:
    """``--mix`` ``COUNTxTURNS,...`` as turns per group, in the order given."""
    turns: list[int] = []
    for part in mix.split(","):
        count, sep, per_group = part.strip().partition("x")
        if not (sep and count.isdigit() and per_group.isdigit() and int(count) > 0 and int(per_group) > 0):
            raise ValueError(
                f"--mix: want COUNTxTURNS,... with positive integers (e.g. 1x32,60x2), got {part!r}"
            )
        if int(per_group) > max_turns:
            raise ValueError(f"--mix: {part!r} has more turns than --max-turns ({max_turns})")
        turns += [int(per_group)] * int(count)
    return turns


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def engine_timing(cfg: Config) -> tuple[float, float]:
    """The engines' ``--step-ms`` and ``--step-ms-per-seq``: the flags, or ``--cost-model``'s line."""
    if not cfg.cost_model:
        return cfg.step_ms, cfg.step_ms_per_seq
    try:
        acc, model, context = cfg.cost_model.split(":")
        context_tokens = float(context)
    except ValueError:
        raise ValueError(f"--cost-model: want ACCELERATOR:MODEL:CONTEXT, got {cfg.cost_model!r}") from None
    intercept, per_seq = costmodel.decode_step_line(
        costmodel.accelerator(acc), costmodel.model(model), context_tokens=context_tokens, max_batch=cfg.slots
    )
    scale = cfg.step_ms / (intercept + per_seq)  # batch 1 takes --step-ms, as without the model
    return intercept * scale, per_seq * scale


async def start_env(stack: stack_mod.Stack) -> str:
    """The environment server, able to load ``heddle_tools`` (``--tool-s``) from this directory."""
    path = os.pathsep.join(p for p in (str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")) if p)
    env = await stack.start(
        "env", "treadle.services.env", ["--allow-user-module", "heddle_tools"], kind="http",
        env={"PYTHONPATH": path},
    )  # fmt: skip
    return env.url


def environment(cfg: Config) -> str:
    return heddle_tools.NAME if cfg.tool_s > 0 else "math-tool"


def group_options(cfg: Config, turns: int) -> dict[str, Any]:
    return {"max_turns": turns, "tool_s": cfg.tool_s} if cfg.tool_s > 0 else {"max_turns": turns}


async def start_shared(stack: stack_mod.Stack, cfg: Config) -> dict[str, Any]:
    """Engines, agents, one environment server and the reward gateway, kept across configurations."""
    reward = (await stack.start("reward", "treadle.services.reward", [], kind="http")).url
    env = await start_env(stack)
    agents = {}
    engines = []
    prefill = (
        ["--prefill-us-per-token", str(cfg.prefill_us_per_token), "--max-num-batched-tokens",
         str(cfg.max_num_batched_tokens), "--prefix-cache-blocks", str(cfg.prefix_cache_blocks)]
        if cfg.prefill else []
    )  # fmt: skip
    step_ms, per_seq_ms = engine_timing(cfg)
    for i in range(cfg.engines):
        engine = await stack.start(
            f"engine-{i}", "treadle.services.fakevllm",
            ["--step-ms", str(step_ms), "--step-ms-per-seq", str(per_seq_ms),
             "--max-num-seqs", str(cfg.slots), "--eos-probability", "0", "--max-model-len", "131072",
             *prefill],
            kind="http", health_path="/health",
        )  # fmt: skip
        engines.append(engine.url)
        agent = await stack.start(
            f"agent-{i}", "treadle.services.agent",
            ["--engine-url", engine.url, "--worker-id", f"w{i}", "--poll-interval-s", "0.5"], kind="http",
        )  # fmt: skip
        agents[f"w{i}"] = agent.url
    return {"reward": reward, "env": env, "agents": agents, "engines": engines}


def bench_job(name: str, cfg: Config, groups: int) -> v1alpha1.RolloutJob:
    """One configuration as a RolloutJob: one decode-heavy pool of the simulated engines, one task.

    Staleness is the spec's largest: no version is committed here, so it never binds.
    """
    policy = CONFIGS[name]
    return v1alpha1.parse_job({
        "apiVersion": v1alpha1.API_VERSION, "kind": v1alpha1.KIND, "metadata": {"name": name},
        "spec": {
            "agents": [{"name": "default", "model": "simulated"}],
            "pools": [{"name": "decode", "agent": "default", "accelerator": "H100", "replicas": cfg.engines,
                       "preferredWork": "decode-heavy"}],
            "tasks": [{"name": "math", "agents": ["default"], "environment": environment(cfg),
                       "reward": "math", "affinity": "decode-heavy", "groupSize": cfg.group_size,
                       "maxTurns": cfg.max_turns}],
            "reward": {"scaleToZero": False, "minReplicas": 1},
            "rollout": {"batchSize": groups * cfg.group_size, "staleness": 64,
                        "schedulingPolicy": policy["scheduling"], "placementPolicy": policy["placement"]},
        },
    })  # fmt: skip


async def run_config(
    name: str, shared: dict[str, Any], cfg: Config, turns: list[int], run_dir: Path
) -> dict[str, Any]:
    policy = CONFIGS[name]
    members = len(turns) * cfg.group_size
    with stack_mod.Stack(run_dir / name) as stack:
        job = podenv.job_env(bench_job(name, cfg, len(turns)), stack.run_dir)
        buffer = await stack.start(
            "buffer", "treadle.services.buffer", ["--namespace", name], kind="grpc", env=job
        )
        placement = await stack.start("placement", "treadle.services.placement", [], kind="grpc", env=job)
        # What the job has no field for: the scheduler's counts and its preemption and queue knobs.
        max_progress = float(policy.get("max_progress", cfg.preemption_max_progress))
        slots = cfg.gate // cfg.engines if policy.get("per_worker") else 0
        counts = ["--max-tokens", str(cfg.tokens), "--max-in-flight", str(members * 2),
                  "--max-concurrent-generations", str(cfg.gate), "--worker-slots", str(slots),
                  "--preemption-margin", str(cfg.preemption_margin),
                  "--preemption-max-progress", str(max_progress)]  # fmt: skip
        scheduler = await stack.start(
            "scheduler", "treadle.services.scheduler",
            [*counts, "--env-url", shared["env"], "--reward-url", shared["reward"], "--placement",
             placement.address, "--buffer", buffer.address],
            kind="grpc", env=job,
        )  # fmt: skip
        pc = placement_client.PlacementClient(placement.address)
        sc = scheduler_client.SchedulerClient(scheduler.address)
        reporting: asyncio.Task[None] | None = None
        try:
            workers = [placement_pb2.Worker(worker_id=wid, pool="decode", address=url)
                       for wid, url in shared["agents"].items()]  # fmt: skip
            for worker in workers:
                await pc.register_worker(worker)
            # Placement lets a worker go that has not reported for --lost-after-s (10 s): the agents'
            # loads go to it as local mode sends them (the agent's own reporter in a cluster).
            reporting = asyncio.create_task(run_mod.report_loads(run_mod.Services(
                scheduler=scheduler.address, placement=placement.address, buffer=buffer.address,
                reward=shared["reward"], envs=[shared["env"]], agents=shared["agents"], engines={},
                metrics={}, token="", workers=workers,
            )))  # fmt: skip
            steps: list[float] = []
            listed: list[dict[str, Any]] = []
            finished: dict[str, tuple[float, int, int]] = {}
            stored = asyncio.Event()
            collector = asyncio.create_task(heddle_probes.collect(sc, finished, stored))
            probes: list[dict[str, Any]] = []
            counted: list[dict[str, float]] = []
            migrations = 0
            for step in range(cfg.steps):
                groups = [
                    scheduler_pb2.PromptGroup(
                        group_id=f"s{step}-g{g}",
                        task="math",
                        seed=g,
                        options_json=_json(group_options(cfg, t)),
                    )
                    for g, t in enumerate(turns)
                ]
                before = await heddle_probes.engine_counters(shared["engines"], reset=True)
                began = time.monotonic()
                sampled = heddle_probes.StepProbe(began)
                sampler = (
                    asyncio.create_task(heddle_probes.probe(pc, sc, sampled, cfg.probe_s))
                    if cfg.probe_s > 0
                    else None
                )
                await sc.submit(groups)
                target = members * (step + 1)
                deadline = began + cfg.step_timeout_s
                while True:
                    stats = await sc.stats()
                    if stats.completed + stats.failed + stats.aborted >= target and stats.unsaved == 0:
                        break
                    if time.monotonic() > deadline:
                        stuck = (await sc.list_trajectories(limit=20)).trajectories
                        raise TimeoutError(
                            f"{name} step {step} not done in {cfg.step_timeout_s}s: {stats}\n"
                            f"in flight:\n{stuck}"
                        )
                    if not listed and step == cfg.steps - 1:
                        reply = await sc.list_trajectories(limit=5)
                        listed = [
                            {"trajectory_id": t.trajectory_id, "rank": t.rank, "turns": t.turns,
                             "predicted_remaining": round(t.predicted_remaining, 1), "worker": t.worker_id,
                             "state": t.state}
                            for t in reply.trajectories
                        ]  # fmt: skip
                    await asyncio.sleep(0.02)
                steps.append(time.monotonic() - began)
                after = await heddle_probes.engine_counters(shared["engines"])
                counted.append({k: after[k] - before[k] for k in after})
                if sampler is not None:
                    sampler.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await sampler
                    while True:  # the results stream may trail the stats by a message
                        stored.clear()
                        if sum(t.startswith(f"s{step}-") for t in finished) >= members:
                            break
                        await asyncio.wait_for(stored.wait(), timeout=10.0)
                    summary = heddle_probes.summarise(sampled, finished, step, cfg.tokens)
                    now = (await pc.pool_state()).migrations
                    summary["migrations"], migrations = now - migrations, now
                    probes.append(summary)
            collector.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await collector
            stats = await sc.stats()
            pool = await pc.pool_state()
        finally:
            if reporting is not None:
                reporting.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await reporting
            await pc.aclose()
            await sc.aclose()
    return {
        "placement": policy["placement"], "scheduling": policy["scheduling"], "step_s": steps,
        "completed": stats.completed, "failed": stats.failed, "aborted": stats.aborted, "turns": stats.turns,
        "preemptions": stats.preemptions, "migrations": pool.migrations, "top_ranked_at_submit": listed,
        "failed_by_reason": dict(stats.failed_by_reason), "probes": probes, "engine": counted,
        "prefix_cache": [{k: c[k] for k in ("queries", "hits")} for c in counted],
    }  # fmt: skip


async def main(cfg: Config, out: Path) -> dict[str, Any]:
    turns = workload(cfg)
    results: dict[str, Any] = {"config": dataclasses.asdict(cfg), "turns_per_group": turns, "configs": {}}
    results["engine_ms"] = engine_timing(cfg)
    with stack_mod.Stack(out / "shared") as stack:
        shared = await start_shared(stack, cfg)
        names = cfg.configs.split(",")
        for rnd in range(cfg.rounds):
            # alternate the order every round, so drifting machine load does not favour one configuration
            for name in names if rnd % 2 == 0 else names[::-1]:
                before = heddle_probes.load()
                run = await run_config(name, shared, cfg, turns, out / f"round{rnd}")
                run |= {"round": rnd, "load_before": before, "load_after": heddle_probes.load()}
                run["measured_s"] = run["step_s"][1:] or run["step_s"]  # the first step warms the predictor
                results["configs"].setdefault(name, []).append(run)
    measured = {n: [s for r in runs for s in r["measured_s"]] for n, runs in results["configs"].items()}
    (out / "results.json").write_text(json.dumps(results, indent=2))  # kept if a later step fails
    results["mean_step_s"] = {n: statistics.mean(v) for n, v in measured.items()}
    means = results["mean_step_s"]
    results["speedup"] = {n: means["baseline"] / m for n, m in means.items() if "baseline" in means}
    return results


def report(results: dict[str, Any], load: str) -> None:
    cfg = results["config"]
    turns = results["turns_per_group"]
    print("SIMULATED ENGINE (fakevllm); every service a real process on 127.0.0.1")
    print(f"load average at start: {load}")
    print(f"workload: {len(turns)} groups x {cfg['group_size']}, turns per group median "
          f"{statistics.median(turns)}, max {max(turns)}, total {sum(turns) * cfg['group_size']} turns of "
          f"{cfg['tokens']} tokens; {cfg['engines']} engines x {cfg['slots']} slots, decode step "
          f"{results['engine_ms'][0]:.3f} ms + {results['engine_ms'][1]:.3f} ms per running sequence"
          f"{' (cost model ' + cfg['cost_model'] + ')' if cfg.get('cost_model') else ''}; "
          f"gate {cfg['gate']}")  # fmt: skip
    if cfg.get("prefill"):
        print(f"prefill: {cfg['prefill_us_per_token']} us per prefilled token, at most "
              f"{cfg['max_num_batched_tokens']} tokens a step, prefix cache {cfg['prefix_cache_blocks']} "
              "blocks of 16 per engine, reset before every step")  # fmt: skip
    else:
        print("prefill: not modelled (free and immediate), no prefix cache")
    for name, runs in results["configs"].items():
        for r in runs:
            steps = ", ".join(f"{s:.2f}" for s in r["step_s"])
            print(f"  {name:17s} ({r['placement']} / {r['scheduling']}): step s [{steps}]  completed "
                  f"{r['completed']} failed {r['failed']}  preemptions {r['preemptions']} "
                  f"migrations {r['migrations']}; round {r['round']}, load {r['load_before']} -> "
                  f"{r['load_after']}")  # fmt: skip
        measured = [s for r in runs for s in r["measured_s"]]
        spread = statistics.stdev(measured) if len(measured) > 1 else 0.0
        print(f"  {name:17s} mean of warm steps {results['mean_step_s'][name]:.2f} s (sd {spread:.2f}, "
              f"n {len(measured)})")  # fmt: skip
        warm = [c for r in runs for c in r.get("prefix_cache", [])[1:]]
        if warm and any(c["queries"] for c in warm):
            queries = statistics.mean(c["queries"] for c in warm)
            hits = statistics.mean(c["hits"] for c in warm)
            print(f"  {name:17s} warm steps: prompt tokens {queries:,.0f}/step, prefix cache hits "
                  f"{hits / queries:.1%}, prefilled {queries - hits:,.0f}/step")  # fmt: skip
    for name, x in results["speedup"].items():
        if name != "baseline":
            print(f"speedup of {name} (baseline mean step time / its mean step time): {x:.2f}x")
    heddle_probes.report_intervals(results)
    heddle_probes.report_probes(results)


if __name__ == "__main__":
    config = benchcli.parse(Config, __doc__)
    out_dir = Path(config.out or tempfile.mkdtemp(prefix="heddle-live-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    load_avg = heddle_probes.load()
    res = asyncio.run(main(config, out_dir))
    res["load_average_start"] = load_avg
    res["load_average_end"] = heddle_probes.load()
    (out_dir / "results.json").write_text(json.dumps(res, indent=2))
    report(res, load_avg)
    print(f"load average at end: {res['load_average_end']}; results in {out_dir / 'results.json'}")
