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
trajectories are far longer than the rest. Every turn generates exactly ``--tokens`` tokens
(``--eos-probability 0``). At most ``--gate`` turns generate at once (the scheduler's
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
migrations, and the load average (the machine is shared: figures move with it).

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
import itertools
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
import httpx

from treadle.api import v1alpha1
from treadle.localmode import stack as stack_mod
from treadle.services import podenv
from treadle.services.agent import service as agent_service
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
    tokens: int = dataclasses.field(default=32, metadata={"help": "tokens every turn generates"})
    median_turns: float = dataclasses.field(
        default=2.0, metadata={"help": "median turns per group (lognormal)"}
    )
    sigma: float = dataclasses.field(default=1.3, metadata={"help": "sigma of the lognormal turns per group"})
    max_turns: int = dataclasses.field(default=48, metadata={"help": "cap on turns per group"})
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


@dataclasses.dataclass
class StepProbe:
    """What one rollout step looked like from outside: sampled every ``--probe-s`` seconds."""

    began: float
    load: list[tuple[float, dict[str, int]]] = dataclasses.field(default_factory=list)
    """(seconds into the step, turns outstanding per worker) from the placement service."""
    predicted: dict[tuple[str, int], float] = dataclasses.field(default_factory=dict)
    """(trajectory, tokens so far) -> the scheduler's predicted remaining tokens at that point."""
    workers: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    """Trajectory -> the workers its turns were seen on, in order."""


async def probe(pc: Any, sc: Any, p: StepProbe, every_s: float) -> None:
    """Sample load, predictions and workers until cancelled."""
    while True:
        pool, listed = await asyncio.gather(pc.pool_state(), sc.list_trajectories(limit=1_000_000))
        now = time.monotonic() - p.began
        p.load.append((now, {w.worker.worker_id: w.outstanding for w in pool.workers}))
        for t in listed.trajectories:
            p.predicted.setdefault((t.trajectory_id, t.tokens_so_far), t.predicted_remaining)
            seen = p.workers.setdefault(t.trajectory_id, [])
            if t.worker_id and (not seen or seen[-1] != t.worker_id):
                seen.append(t.worker_id)
        await asyncio.sleep(every_s)


async def collect(sc: Any, finished: dict[str, tuple[float, int, int]], stored: asyncio.Event) -> None:
    """Every stored trajectory: id -> (monotonic time stored, output tokens, turns)."""
    async for r in sc.results():
        finished[r.trajectory_id] = (time.monotonic(), r.output_tokens, r.turns)
        stored.set()


def summarise(
    p: StepProbe, finished: dict[str, tuple[float, int, int]], step: int, tokens: int
) -> dict[str, Any]:
    """One step's load per worker, completion profile, trajectories per worker and predictor error."""
    mine = {tid: f for tid, f in finished.items() if tid.startswith(f"s{step}-")}
    ends = sorted(at - p.began for at, _, _ in mine.values())
    workers = sorted({w for _, load in p.load for w in load})
    spans = [b[0] - a[0] for a, b in itertools.pairwise(p.load)]
    span = sum(spans) or 1.0
    mean_load = {
        w: sum(d * a[1].get(w, 0) for d, a in zip(spans, p.load, strict=False)) / span for w in workers
    }
    gap = (
        sum(d * (max(a[1].values()) - min(a[1].values())) for d, a in zip(spans, p.load, strict=False)) / span
    )
    by_worker: dict[str, dict[str, int]] = {w: {"trajectories": 0, "turns": 0, "moved": 0} for w in workers}
    for tid, seen in p.workers.items():
        if tid in mine and seen:
            row = by_worker.setdefault(seen[-1], {"trajectories": 0, "turns": 0, "moved": 0})
            row["trajectories"] += 1
            row["turns"] += mine[tid][2]
            row["moved"] += len(seen) > 1
    longest = sorted(mine, key=lambda tid: -mine[tid][2])[:6]
    errors: dict[int, list[tuple[float, float]]] = {}
    for (tid, so_far), predicted in p.predicted.items():
        if tid in mine:
            errors.setdefault(so_far // tokens, []).append((predicted, mine[tid][1] - so_far))
    return {
        "load_mean": {w: round(x, 2) for w, x in mean_load.items()},
        "load_gap_mean": round(gap, 2),
        "done_at_s": {
            str(q): round(ends[min(len(ends) - 1, int(q / 100 * len(ends)))], 2) for q in (50, 90, 99)
        }
        if ends
        else {},
        "last_s": round(ends[-1], 2) if ends else None,
        "by_worker": by_worker,
        "longest": {
            tid: {
                "turns": mine[tid][2],
                "workers": p.workers.get(tid, []),
                "done_s": round(mine[tid][0] - p.began, 2),
            }
            for tid in longest
        },
        "prediction_error": {k: _error(v) for k, v in sorted(errors.items())},
    }


def _error(pairs: list[tuple[float, float]]) -> dict[str, float]:
    """|predicted - actual| remaining tokens: median, mean, and MAPE where the actual is positive."""
    absolute = [abs(pr - ac) for pr, ac in pairs]
    relative = [abs(pr - ac) / ac for pr, ac in pairs if ac > 0]
    return {
        "n": len(pairs),
        "median_abs": round(statistics.median(absolute), 1),
        "mean_abs": round(statistics.mean(absolute), 1),
        "mape": round(statistics.mean(relative), 3) if relative else math.nan,
        "mean_actual": round(statistics.mean(ac for _, ac in pairs), 1),
    }


def workload(cfg: Config) -> list[int]:
    """Turns per group: lognormal, capped, the same in every step and configuration."""
    rng = random.Random(cfg.seed)
    return [
        max(1, min(cfg.max_turns, round(cfg.median_turns * math.exp(rng.gauss(0.0, cfg.sigma)))))
        for _ in range(cfg.groups)
    ]


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


async def start_shared(stack: stack_mod.Stack, cfg: Config) -> dict[str, Any]:
    """Engines, agents, one environment server and the reward gateway, kept across configurations."""
    reward = (await stack.start("reward", "treadle.services.reward", [], kind="http")).url
    env = (await stack.start("env", "treadle.services.env", [], kind="http")).url
    agents = {}
    engines = []
    prefill = (
        ["--prefill-us-per-token", str(cfg.prefill_us_per_token), "--max-num-batched-tokens",
         str(cfg.max_num_batched_tokens), "--prefix-cache-blocks", str(cfg.prefix_cache_blocks)]
        if cfg.prefill else []
    )  # fmt: skip
    for i in range(cfg.engines):
        engine = await stack.start(
            f"engine-{i}", "treadle.services.fakevllm",
            ["--step-ms", str(cfg.step_ms), "--step-ms-per-seq", str(cfg.step_ms_per_seq),
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


async def engine_counters(engines: list[str], *, reset: bool = False) -> dict[str, float]:
    """Prompt tokens queried / hit in the engines' prefix caches, summed; ``reset`` empties the caches."""
    total = {"queries": 0.0, "hits": 0.0}
    async with httpx.AsyncClient(timeout=10.0) as http:
        for url in engines:
            if reset:
                (await http.post(f"{url}/reset_prefix_cache")).raise_for_status()
            got = agent_service.parse_metrics((await http.get(f"{url}/metrics")).text)
            total["queries"] += got.get("vllm:prefix_cache_queries_total", 0.0)
            total["hits"] += got.get("vllm:prefix_cache_hits_total", 0.0)
    return total


def bench_job(name: str, cfg: Config) -> v1alpha1.RolloutJob:
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
            "tasks": [{"name": "math", "agents": ["default"], "environment": "math-tool", "reward": "math",
                       "affinity": "decode-heavy", "groupSize": cfg.group_size, "maxTurns": cfg.max_turns}],
            "reward": {"scaleToZero": False, "minReplicas": 1},
            "rollout": {"batchSize": cfg.groups * cfg.group_size, "staleness": 64,
                        "schedulingPolicy": policy["scheduling"], "placementPolicy": policy["placement"]},
        },
    })  # fmt: skip


async def run_config(
    name: str, shared: dict[str, Any], cfg: Config, turns: list[int], run_dir: Path
) -> dict[str, Any]:
    policy = CONFIGS[name]
    members = cfg.groups * cfg.group_size
    with stack_mod.Stack(run_dir / name) as stack:
        job = podenv.job_env(bench_job(name, cfg), stack.run_dir)
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
        try:
            for wid, url in shared["agents"].items():
                await pc.register_worker(placement_pb2.Worker(worker_id=wid, pool="decode", address=url))
            steps: list[float] = []
            listed: list[dict[str, Any]] = []
            finished: dict[str, tuple[float, int, int]] = {}
            stored = asyncio.Event()
            collector = asyncio.create_task(collect(sc, finished, stored))
            probes: list[dict[str, Any]] = []
            cache: list[dict[str, float]] = []
            migrations = 0
            for step in range(cfg.steps):
                groups = [
                    scheduler_pb2.PromptGroup(
                        group_id=f"s{step}-g{g}", task="math", seed=g, options_json=_json({"max_turns": t})
                    )
                    for g, t in enumerate(turns)
                ]
                before = await engine_counters(shared["engines"], reset=True)
                began = time.monotonic()
                sampled = StepProbe(began)
                sampler = (
                    asyncio.create_task(probe(pc, sc, sampled, cfg.probe_s)) if cfg.probe_s > 0 else None
                )
                await sc.submit(groups)
                target = members * (step + 1)
                deadline = began + cfg.step_timeout_s
                while True:
                    stats = await sc.stats()
                    if stats.completed + stats.failed + stats.aborted >= target and stats.unsaved == 0:
                        break
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"{name} step {step} not done in {cfg.step_timeout_s}s: {stats}")
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
                after = await engine_counters(shared["engines"])
                cache.append({k: after[k] - before[k] for k in after})
                if sampler is not None:
                    sampler.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await sampler
                    while True:  # the results stream may trail the stats by a message
                        stored.clear()
                        if sum(t.startswith(f"s{step}-") for t in finished) >= members:
                            break
                        await asyncio.wait_for(stored.wait(), timeout=10.0)
                    summary = summarise(sampled, finished, step, cfg.tokens)
                    now = (await pc.pool_state()).migrations
                    summary["migrations"], migrations = now - migrations, now
                    probes.append(summary)
            collector.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await collector
            stats = await sc.stats()
            pool = await pc.pool_state()
        finally:
            await pc.aclose()
            await sc.aclose()
    return {
        "placement": policy["placement"], "scheduling": policy["scheduling"], "step_s": steps,
        "completed": stats.completed, "failed": stats.failed, "aborted": stats.aborted, "turns": stats.turns,
        "preemptions": stats.preemptions, "migrations": pool.migrations, "top_ranked_at_submit": listed,
        "failed_by_reason": dict(stats.failed_by_reason), "probes": probes, "prefix_cache": cache,
    }  # fmt: skip


async def main(cfg: Config, out: Path) -> dict[str, Any]:
    turns = workload(cfg)
    results: dict[str, Any] = {"config": dataclasses.asdict(cfg), "turns_per_group": turns, "configs": {}}
    with stack_mod.Stack(out / "shared") as stack:
        shared = await start_shared(stack, cfg)
        names = cfg.configs.split(",")
        for rnd in range(cfg.rounds):
            # alternate the order every round, so drifting machine load does not favour one configuration
            for name in names if rnd % 2 == 0 else names[::-1]:
                run = await run_config(name, shared, cfg, turns, out / f"round{rnd}")
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
    print(f"workload: {cfg['groups']} groups x {cfg['group_size']}, turns per group median "
          f"{statistics.median(turns)}, max {max(turns)}, total {sum(turns) * cfg['group_size']} turns of "
          f"{cfg['tokens']} tokens; {cfg['engines']} engines x {cfg['slots']} slots, decode step "
          f"{cfg['step_ms']} ms + {cfg['step_ms_per_seq']} ms per running sequence; "
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
                  f"migrations {r['migrations']}")  # fmt: skip
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
    report_probes(results)


def report_probes(results: dict[str, Any]) -> None:
    """The warm steps' probes per configuration, then the predictor's error by turns done."""
    errors: dict[int, list[dict[str, float]]] = {}
    for name, runs in results["configs"].items():
        probes = [p for r in runs for p in r.get("probes", [])[1:]]
        if not probes:
            continue
        workers = sorted(probes[0]["load_mean"])
        load = " / ".join(f"{statistics.mean(p['load_mean'][w] for p in probes):.1f}" for w in workers)
        held = " / ".join(
            f"{statistics.mean(p['by_worker'][w]['trajectories'] for p in probes):.0f}:"
            f"{statistics.mean(p['by_worker'][w]['turns'] for p in probes):.0f}"
            for w in workers
        )
        first = statistics.mean(
            sum(v["workers"][-1:] == workers[:1] for v in p["longest"].values()) for p in probes
        )
        done = statistics.mean(v["done_s"] for p in probes for v in p["longest"].values())
        print(f"  {name:17s} outstanding {' / '.join(workers)} {load} (gap "
              f"{statistics.mean(p['load_gap_mean'] for p in probes):.1f}); trajectories:turns {held}; "
              f"longest 6 on {workers[0]} {first:.1f}, done at {done:.2f} s; migrations/step "
              f"{statistics.mean(p['migrations'] for p in probes):.0f}; half done at "
              f"{statistics.mean(p['done_at_s']['50'] for p in probes):.2f} s")  # fmt: skip
        for p in probes:
            for k, e in p["prediction_error"].items():
                errors.setdefault(int(k), []).append(e)
    if errors:
        print("predictor error, warm steps, |predicted - actual| remaining tokens by turns done k (some k):")
        for k in sorted(k for k in errors if k <= 5 or k % 10 == 0):
            es = errors[k]
            mape = [e["mape"] for e in es if not math.isnan(e["mape"])]
            print(f"  k {k:3d}: n {sum(int(e['n']) for e in es):5d}  median "
                  f"{statistics.median(e['median_abs'] for e in es):7.1f}  MAPE "
                  f"{statistics.median(mape) if mape else math.nan:5.2f}")  # fmt: skip


if __name__ == "__main__":
    config = benchcli.parse(Config, __doc__)
    out_dir = Path(config.out or tempfile.mkdtemp(prefix="heddle-live-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    load_avg = " ".join(f"{x:.2f}" for x in os.getloadavg())
    res = asyncio.run(main(config, out_dir))
    res["load_average_start"] = load_avg
    res["load_average_end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    (out_dir / "results.json").write_text(json.dumps(res, indent=2))
    report(res, load_avg)
    print(f"load average at end: {res['load_average_end']}; results in {out_dir / 'results.json'}")
