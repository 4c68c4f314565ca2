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

Run: ``PYTHONPATH=. python bench/heddle_live.py [--out DIR]``; results in ``DIR/results.json``.
"""

from __future__ import annotations

import argparse
import asyncio
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

from treadle.localmode import stack as stack_mod
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
    groups: int = 32
    group_size: int = 2
    engines: int = 2
    slots: int = 64
    gate: int = 64
    step_ms: float = 2.0
    step_ms_per_seq: float = 0.2
    tokens: int = 32
    median_turns: float = 2.0
    sigma: float = 1.3
    max_turns: int = 48
    steps: int = 3
    seed: int = 0
    step_timeout_s: float = 300.0
    preemption_margin: float = 0.0
    preemption_max_progress: float = 0.25
    """``Settings.preemption_max_progress`` of the preemptive configurations but ``heddle-unbounded``."""
    configs: str = ",".join(CONFIGS)
    rounds: int = 1
    """Each configuration runs once per round (fresh processes); the order alternates per round."""


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
    for i in range(cfg.engines):
        engine = await stack.start(
            f"engine-{i}", "treadle.services.fakevllm",
            ["--step-ms", str(cfg.step_ms), "--step-ms-per-seq", str(cfg.step_ms_per_seq),
             "--max-num-seqs", str(cfg.slots), "--eos-probability", "0", "--max-model-len", "131072"],
            kind="http", health_path="/health",
        )  # fmt: skip
        agent = await stack.start(
            f"agent-{i}", "treadle.services.agent",
            ["--engine-url", engine.url, "--worker-id", f"w{i}", "--poll-interval-s", "0.5"], kind="http",
        )  # fmt: skip
        agents[f"w{i}"] = agent.url
    return {"reward": reward, "env": env, "agents": agents}


async def run_config(
    name: str, shared: dict[str, Any], cfg: Config, turns: list[int], run_dir: Path
) -> dict[str, Any]:
    policy = CONFIGS[name]
    members = cfg.groups * cfg.group_size
    with stack_mod.Stack(run_dir / name) as stack:
        buffer = await stack.start(
            "buffer", "treadle.services.buffer",
            ["--alpha", "1000", "--task-weights", _json({"math": 1}), "--namespace", name], kind="grpc",
        )  # fmt: skip
        placement = await stack.start(
            "placement", "treadle.services.placement",
            ["--pools", _json({"decode": "decode-heavy"}),
             "--tasks", _json({"math": {"affinity": "decode-heavy", "pools": []}}),
             "--policy", policy["placement"]],
            kind="grpc",
        )  # fmt: skip
        task = {"name": "math", "env": "math-tool", "group_size": cfg.group_size, "max_turns": cfg.max_turns,
                "max_tokens": cfg.tokens}  # fmt: skip
        settings = {
            "alpha": 1000, "batch_size": members, "max_in_flight": members * 2,
            "max_concurrent_generations": cfg.gate, "scheduling_policy": policy["scheduling"],
            "preemption_margin": cfg.preemption_margin,
            "preemption_max_progress": float(policy.get("max_progress", cfg.preemption_max_progress)),
            "worker_slots": cfg.gate // cfg.engines if policy.get("per_worker") else 0,
        }  # fmt: skip
        scheduler = await stack.start(
            "scheduler", "treadle.services.scheduler",
            ["--tasks", _json([task]), "--settings", _json(settings), "--env-url", shared["env"],
             "--reward-url", shared["reward"], "--placement", placement.address, "--buffer", buffer.address],
            kind="grpc",
        )  # fmt: skip
        pc = placement_client.PlacementClient(placement.address)
        sc = scheduler_client.SchedulerClient(scheduler.address)
        try:
            for wid, url in shared["agents"].items():
                await pc.register_worker(placement_pb2.Worker(worker_id=wid, pool="decode", address=url))
            steps: list[float] = []
            listed: list[dict[str, Any]] = []
            for step in range(cfg.steps):
                groups = [
                    scheduler_pb2.PromptGroup(
                        group_id=f"s{step}-g{g}", task="math", seed=g, options_json=_json({"max_turns": t})
                    )
                    for g, t in enumerate(turns)
                ]
                began = time.monotonic()
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
            stats = await sc.stats()
            pool = await pc.pool_state()
        finally:
            await pc.aclose()
            await sc.aclose()
    return {
        "placement": policy["placement"], "scheduling": policy["scheduling"], "step_s": steps,
        "completed": stats.completed, "failed": stats.failed, "aborted": stats.aborted, "turns": stats.turns,
        "preemptions": stats.preemptions, "migrations": pool.migrations, "top_ranked_at_submit": listed,
        "failed_by_reason": dict(stats.failed_by_reason),
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
    for name, x in results["speedup"].items():
        if name != "baseline":
            print(f"speedup of {name} (baseline mean step time / its mean step time): {x:.2f}x")


def parse_args() -> tuple[Config, Path]:
    p = argparse.ArgumentParser(description=__doc__)
    for field in dataclasses.fields(Config):
        p.add_argument(f"--{field.name.replace('_', '-')}", type=type(field.default), default=field.default)
    p.add_argument("--out", type=Path, default=None)
    a = vars(p.parse_args())
    out = a.pop("out") or Path(tempfile.mkdtemp(prefix="heddle-live-"))
    return Config(**a), out


if __name__ == "__main__":
    config, out_dir = parse_args()
    out_dir.mkdir(parents=True, exist_ok=True)
    load_avg = " ".join(f"{x:.2f}" for x in os.getloadavg())
    res = asyncio.run(main(config, out_dir))
    res["load_average_start"] = load_avg
    res["load_average_end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    (out_dir / "results.json").write_text(json.dumps(res, indent=2))
    report(res, load_avg)
    print(f"load average at end: {res['load_average_end']}; results in {out_dir / 'results.json'}")
