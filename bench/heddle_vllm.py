"""Heddle against sticky least-loaded on REAL vLLM (CPU build): time to finish a long-tailed rollout step.

REAL ENGINE, TOY MODEL: the engines are real vLLM (the CPU build in the venv, started with
``treadle.models.vllm_server``'s recipe) serving the tiny random Llama of ``treadle.models.tiny``
(2 layers, hidden 128, vocab ~512, random weights, so it never solves anything), generated with a
context of ``--max-model-len`` (``tiny.generate(context=...)``: RoPE has no learned position
table; the weights are random either way) so that multi-turn
trajectories fit. Every other service is its own process on 127.0.0.1, started as
``bench/heddle_live.py`` starts them (reward gateway, math-tool environment server, one inference
agent per routing target, and per configuration fresh buffer, placement and scheduler processes);
the configurations, the workload and the per-step measurement are ``heddle_live``'s own
(``heddle_live.run_config``, ``heddle_live.workload``), imported, not copied.

What it shows: whether the scheduler's ordering and preemption (ABORT + re-issue against real
vLLM) and the placement's routing and migration (a migrated turn re-prefills its whole context on
the other engine, with vLLM's real prefix cache) finish a long-tailed step sooner than FIFO with
sticky least-loaded, with real continuous batching, real prefill and real aborts. What it does not
show: anything about GPU timing, a real model's output lengths or batch interference at scale; a
CPU decode step of this model is dominated by vLLM's per-step overhead, not by the batch size.

Workload: math-tool (the random model never writes ``<answer>``, so a trajectory runs exactly its
group's ``max_turns``), ``--groups`` groups of ``--group-size``, turns per group lognormal (median
``--median-turns``, sigma ``--sigma``, capped at ``--max-turns``; or fixed counts with ``--mix``,
e.g. ``1x32,60x2`` for the critical-path regime of ``docs/SCHEDULING.md``), ``--tokens`` tokens a
turn, every tool call ``--tool-s`` seconds (SIMULATED latency of a remote tool,
``bench/heddle_tools.py``; 0: the math-tool server's own, milliseconds); the
scheduler's global gate (``--gate``) is smaller than the trajectories in flight, so turns queue in
the gate, where the scheduling policy orders (and, for heddle, preempts) them.

Engines: ``--engines`` vLLM processes, ``--agents-per-engine`` inference agents (routing targets,
placement workers) in front of each. ``--omp-threads`` 0 keeps vLLM's own thread binding (one
engine: it takes the cores); n > 0 runs each engine unbound with ``OMP_NUM_THREADS=n`` (two
engines on two cores: 1 each).

Printed (``bench/heddle_probes.py``): every configuration's ratio to the baseline and to its
neighbour without one mechanism, paired per round with a 95 % t interval on the log ratios (at
least 2 rounds; the rounds, not the steps, are the samples), and vLLM's own step count and tokens
per step (``vllm:iteration_tokens_total``) beside the times, with the load average per round.

Run: ``PYTHONPATH=bench:. python bench/heddle_vllm.py [--out DIR]``; results in ``DIR/results.json``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import benchcli
import heddle_live
import heddle_probes

from treadle.localmode import stack as stack_mod
from treadle.models import tiny, vllm_server
from treadle.testing import procs


@dataclasses.dataclass(frozen=True)
class Config:
    engines: int = dataclasses.field(default=2, metadata={"help": "real vLLM (CPU) engines"})
    agents_per_engine: int = dataclasses.field(
        default=1, metadata={"help": "inference agents (placement workers) in front of each engine"}
    )
    omp_threads: int = dataclasses.field(
        default=1,
        metadata={"help": "0: vLLM's own CPU binding; n: each engine unbound with OMP_NUM_THREADS=n"},
    )
    max_model_len: int = dataclasses.field(default=4096, metadata={"help": "vLLM --max-model-len"})
    hidden: int = dataclasses.field(
        default=128, metadata={"help": "generated model width (multiple of 64); wider: batches cost more"}
    )
    layers: int = dataclasses.field(default=2, metadata={"help": "layers of the generated model"})
    max_num_seqs: int = dataclasses.field(default=8, metadata={"help": "vLLM --max-num-seqs per engine"})
    groups: int = dataclasses.field(default=24, metadata={"help": "prompt groups per rollout step"})
    group_size: int = dataclasses.field(default=2, metadata={"help": "trajectories per prompt group"})
    gate: int = dataclasses.field(
        default=4,
        metadata={"help": "turns generating at once over all workers (Settings.max_concurrent_generations)"},
    )
    tokens: int = dataclasses.field(default=16, metadata={"help": "max tokens a turn generates"})
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
    max_turns: int = dataclasses.field(default=24, metadata={"help": "cap on turns per group"})
    mix: str = dataclasses.field(
        default="",
        metadata={
            "help": "COUNTxTURNS,... (e.g. 1x32,60x2): groups of fixed turns instead of lognormal ones"
        },
    )
    steps: int = dataclasses.field(
        default=3, metadata={"help": "rollout steps per configuration (the first warms the predictor)"}
    )
    rounds: int = dataclasses.field(
        default=4,
        metadata={"help": "each configuration once per round, the order alternating; rounds pair up"},
    )
    seed: int = dataclasses.field(default=0, metadata={"help": "seed of the workload"})
    configs: str = dataclasses.field(
        default="baseline,heddle-sched,heddle",
        metadata={"help": "comma-separated configurations of bench/heddle_live.py to run"},
    )
    step_timeout_s: float = dataclasses.field(
        default=300.0, metadata={"help": "a step not done in this many seconds fails the run"}
    )
    probe_s: float = dataclasses.field(
        default=0.25, metadata={"help": "sample per-worker load and predictions this often (0: never)"}
    )
    out: str = dataclasses.field(
        default="", metadata={"help": "directory for results.json (empty: a new temporary one)"}
    )


def live_config(cfg: Config) -> heddle_live.Config:
    """The same run in ``heddle_live``'s terms (its ``engines`` counts routing targets, for worker_slots)."""
    return heddle_live.Config(
        groups=cfg.groups, group_size=cfg.group_size, engines=cfg.engines * cfg.agents_per_engine,
        slots=cfg.max_num_seqs, gate=cfg.gate, tokens=cfg.tokens, tool_s=cfg.tool_s,
        median_turns=cfg.median_turns, sigma=cfg.sigma, max_turns=cfg.max_turns, mix=cfg.mix,
        steps=cfg.steps, seed=cfg.seed,
        step_timeout_s=cfg.step_timeout_s, configs=cfg.configs, rounds=cfg.rounds, probe_s=cfg.probe_s,
    )  # fmt: skip


def make_model(out: Path, cfg: Config) -> Path:
    return tiny.generate(
        out / "tiny-llama", seed=0, context=max(512, cfg.max_model_len), hidden=cfg.hidden, layers=cfg.layers
    )


async def start_shared(stack: stack_mod.Stack, cfg: Config, model: Path, out: Path) -> dict[str, Any]:
    """vLLM engines, their agents, one environment server and the reward gateway, kept across runs."""
    reward = (await stack.start("reward", "treadle.services.reward", [], kind="http")).url
    env = await heddle_live.start_env(stack)
    threads = (
        {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": str(cfg.omp_threads)}
        if cfg.omp_threads > 0
        else {}
    )
    engines = []
    for i in range(cfg.engines):
        port = procs.free_port()
        argv = vllm_server.argv(
            model, port=port, max_model_len=cfg.max_model_len, max_num_seqs=cfg.max_num_seqs
        )
        began = time.monotonic()
        engine = await stack.launch(
            f"vllm-{i}", argv, port=port, kind="http", health_path="/health", timeout_s=600.0,
            env={**vllm_server.environment(out / f"vllm-cache-{i}"), **threads},
        )  # fmt: skip
        print(
            f"vllm-{i} healthy after {time.monotonic() - began:.0f} s (load {heddle_probes.load()})",
            flush=True,
        )
        engines.append(engine.url)
    agents = {}
    for i, url in enumerate(engines):
        for j in range(cfg.agents_per_engine):
            worker = f"w{i * cfg.agents_per_engine + j}"
            agent = await stack.start(
                f"agent-{worker}", "treadle.services.agent",
                ["--engine-url", url, "--worker-id", worker, "--poll-interval-s", "0.5"], kind="http",
            )  # fmt: skip
            agents[worker] = agent.url
    return {"reward": reward, "env": env, "agents": agents, "engines": engines}


async def main(cfg: Config, out: Path) -> dict[str, Any]:
    live = live_config(cfg)
    turns = heddle_live.workload(live)
    results: dict[str, Any] = {"config": dataclasses.asdict(cfg), "turns_per_group": turns, "configs": {}}
    model = make_model(out, cfg)
    with stack_mod.Stack(out / "shared") as stack:
        shared = await start_shared(stack, cfg, model, out)
        names = cfg.configs.split(",")
        for rnd in range(cfg.rounds):
            # alternate the order every round, so drifting machine load does not favour one configuration
            for name in names if rnd % 2 == 0 else names[::-1]:
                before = heddle_probes.load()
                # trajectory ids repeat across runs and the gateway's scores are idempotent per id (a
                # different text for a known id is a conflict): a fresh gateway per run, same port
                await stack.restart("reward")
                run = await heddle_live.run_config(name, shared, live, turns, out / f"round{rnd}")
                run |= {"round": rnd, "load_before": before, "load_after": heddle_probes.load()}
                run["measured_s"] = run["step_s"][1:] or run["step_s"]  # the first step warms the predictor
                results["configs"].setdefault(name, []).append(run)
                print(f"round {rnd} {name}: steps {[round(s, 2) for s in run['step_s']]} s, load "
                      f"{before} -> {run['load_after']}", flush=True)  # fmt: skip
                (out / "results.json").write_text(json.dumps(results, indent=2))  # kept if a later run fails
    return results


def report(results: dict[str, Any]) -> None:
    cfg = results["config"]
    turns = results["turns_per_group"]
    print(
        "REAL vLLM (CPU build), tiny random Llama (treadle.models.tiny); every service a process on 127.0.0.1"
    )
    print(f"load average at start {results['load_average_start']}, at end {results['load_average_end']}")
    print(f"workload: math-tool, {len(turns)} groups x {cfg['group_size']}, turns per group median "
          f"{statistics.median(turns)}, max {max(turns)}, {sum(turns) * cfg['group_size']} turns of at most "
          f"{cfg['tokens']} tokens; {cfg['engines']} engine(s) x {cfg['agents_per_engine']} agents, "
          f"max-num-seqs {cfg['max_num_seqs']}, max-model-len {cfg['max_model_len']}, omp threads "
          f"{cfg['omp_threads'] or 'vLLM default'}; gate {cfg['gate']}")  # fmt: skip
    print(f"turns per group: {sorted(turns, reverse=True)}")
    for name, runs in results["configs"].items():
        for r in runs:
            steps = ", ".join(f"{s:.2f}" for s in r["step_s"])
            print(f"  {name:12s} round {r['round']} ({r['placement']} / {r['scheduling']}): step s [{steps}] "
                  f"completed {r['completed']} failed {r['failed']} {r['failed_by_reason']} preemptions "
                  f"{r['preemptions']} migrations {r['migrations']}; load {r['load_before']} -> "
                  f"{r['load_after']}")  # fmt: skip
        measured = [s for r in runs for s in r["measured_s"]]
        sd = statistics.stdev(measured) if len(measured) > 1 else 0.0
        steps_run = sum(len(r["step_s"]) for r in runs)
        print(f"  {name:12s} warm steps mean {statistics.mean(measured):.2f} s (sd {sd:.2f}, n "
              f"{len(measured)}); per step (all steps): preemptions "
              f"{sum(r['preemptions'] for r in runs) / steps_run:.1f}, migrations "
              f"{sum(r['migrations'] for r in runs) / steps_run:.1f}")  # fmt: skip
        warm = [c for r in runs for c in r["prefix_cache"][1:]]
        if warm and any(c["queries"] for c in warm):
            queries = statistics.mean(c["queries"] for c in warm)
            hits = statistics.mean(c["hits"] for c in warm)
            print(f"  {name:12s} warm steps: prompt tokens {queries:,.0f}/step, prefix cache hits "
                  f"{hits / queries:.1%}")  # fmt: skip
    heddle_probes.report_intervals(results)
    heddle_probes.report_probes(results)


if __name__ == "__main__":
    config = benchcli.parse(Config, __doc__)
    out_dir = Path(config.out or tempfile.mkdtemp(prefix="heddle-vllm-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    load_start = heddle_probes.load()
    res = asyncio.run(main(config, out_dir))
    res |= {"load_average_start": load_start, "load_average_end": heddle_probes.load()}
    (out_dir / "results.json").write_text(json.dumps(res, indent=2))
    report(res)
    print(f"results in {out_dir / 'results.json'}")
