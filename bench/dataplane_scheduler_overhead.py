"""Scheduler + agent overhead per turn at ~2,000 trajectories in flight, with simulated engines.

Measured, not simulated (only the engines are: ``treadle.services.fakevllm``, SIMULATED ENGINE, each
its own process on 127.0.0.1, reached over HTTP). The layout follows a cluster by default: the
2,000 trajectories are spread by placement over ``--engines`` inference "pods" (8 by default, 250
sequences each; vLLM's max_num_seqs is typically 256-512), each an engine process with its own step
timer (their phases drift apart on their own, as separate GPUs' do) and its own inference agent
process (``python -m treadle.services.agent``) that the scheduler reaches over HTTP with the real
``AgentClient`` -- so the scheduler -> agent hop, both ends of it, counts as overhead. In this
process: the real ``SchedulerService`` (admission, gate, retries, bookkeeping, batched buffer
puts), the real ``PlacementService`` (in-process; in a cluster it is a gRPC hop this leaves out) and
``BufferService`` (memory store). The environment and the reward are in-process stand-ins whose own
latency (a random delay, to keep trajectories out of lockstep) is excluded by construction.

``--engines 1 --agent-hop in-process`` is the earlier layout: one engine process serving all 2,000
(one global step timer, so its replies land in bursts of ~100) and the agent called in this process.

Overhead of turn k of a trajectory = (time the scheduler enters ``env.step`` with the action of
turn k) - (time the environment handed back the observation of turn k-1, or of ``open``) - (time
the agent spent inside its HTTP call to the engine for turn k, which the agent reports in
``GenerateResult.engine_seconds``). So it counts everything Treadle does between an observation and
the next action -- gate, placement assign/release, the scheduler -> agent hop, the agent's own work,
event-loop queueing behind the other ~2,000 trajectories -- and nothing the engine or the
environment does. Targets of issue 4: median < 1 ms, p99 < 5 ms. CPU time per turn is printed for
this process, the agent processes and the engine processes. All of them share this machine's
cores (2 here), which a cluster would not make the scheduler and agents share with the engines.

``--pin split`` keeps this process alone on CPU 0 and the agent and engine processes on the other
core(s), the nearest this machine comes to a cluster's separate nodes.

``--agent none`` replaces agents and engines with an in-process stand-in that answers after the
engine's time, to measure the scheduler alone.

Run: ``python bench/dataplane_scheduler_overhead.py [--engines 1 --agent-hop in-process] [--agent
none]``; results in ``--out`` (config.json, results.json). ``--matrix earlier,pods-http,...`` runs
several layouts one after another (each in a fresh process) and prints them side by side.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import benchcli
import prometheus_client

from treadle.api import jobconfig
from treadle.localmode import stack as stack_mod
from treadle.services import runtime
from treadle.services.agent import client as agent_client
from treadle.services.agent import protocol as agent_protocol
from treadle.services.agent import service as agent_service
from treadle.services.buffer import service as buffer_service
from treadle.services.buffer import store
from treadle.services.env import protocol as env_protocol
from treadle.services.placement import service as placement_service
from treadle.services.reward import protocol as reward_protocol
from treadle.services.scheduler import client as scheduler_client
from treadle.services.scheduler import protocol as scheduler_protocol
from treadle.services.scheduler import service as scheduler_service
from treadle.v1 import placement_pb2

TARGET_MEDIAN_MS, TARGET_P99_MS = 1.0, 5.0


LAYOUTS: dict[str, dict[str, str]] = {
    "earlier": {"engines": "1", "agent-hop": "in-process"},
    "pods-in-process": {"engines": "8", "agent-hop": "in-process"},
    "pods-http": {"engines": "8", "agent-hop": "http"},
    "pods-http-uvloop": {"engines": "8", "agent-hop": "http", "loop": "uvloop"},
    "pods-http-pinned": {"engines": "8", "agent-hop": "http", "pin": "split"},
    "pods-http-gc-cpython": {"engines": "8", "agent-hop": "http", "gc": "cpython"},
    "scheduler-alone": {"agent": "none"},
}
"""``--matrix`` layouts: the flags each sets over the command line's."""


@dataclasses.dataclass
class Config:
    in_flight: int = dataclasses.field(
        default=2000, metadata={"help": "trajectories in flight (max_in_flight)"}
    )
    trajectories: int = dataclasses.field(default=4000, metadata={"help": "trajectories in all"})
    group_size: int = dataclasses.field(default=8, metadata={"help": "members per group"})
    turns: int = dataclasses.field(default=4, metadata={"help": "turns per trajectory"})
    max_tokens: int = dataclasses.field(default=16, metadata={"help": "tokens per turn (no early EOS)"})
    step_ms: float = dataclasses.field(default=250.0, metadata={"help": "simulated engine step time"})
    env_max_s: float = dataclasses.field(default=2.0, metadata={"help": "env latency ~ U(0, this)"})
    seed: int = dataclasses.field(default=0, metadata={"help": "seed of the env latencies"})
    agent: str = dataclasses.field(
        default="real",
        metadata={
            "help": "real: the agent + simulated engine over HTTP; none: an instant in-process stand-in "
            "answering after step_ms * max_tokens, to measure the scheduler alone"
        },
    )
    engines: int = dataclasses.field(
        default=8, metadata={"help": "simulated engine processes (inference pods), each with its own agent"}
    )
    agent_hop: str = dataclasses.field(
        default="http",
        metadata={
            "help": "http: each agent its own process, called over HTTP as in a cluster; in-process: "
            "the agents run in this process and are called directly (the earlier layout)"
        },
    )
    pin: str = dataclasses.field(
        default="none",
        metadata={
            "help": "none: every process on every core; split: this process (scheduler) alone on CPU 0, "
            "agent and engine processes on the others, as a cluster keeps pods off the scheduler's node"
        },
    )
    loop: str = dataclasses.field(
        default="asyncio", metadata={"help": "event loop of this process: asyncio or uvloop"}
    )
    gc: str = dataclasses.field(
        default="service",
        metadata={
            "help": "service: this process settles its heap after setup as the scheduler's __main__ does "
            "(treadle.services.runtime.settle_heap: gc.freeze, full collections rarer); cpython: the "
            "collector as CPython sets it, for comparison"
        },
    )
    matrix: str = dataclasses.field(
        default="",
        metadata={
            "help": "comma list of layouts to run one after another, each in a fresh process with the "
            f"other options as given, then print them side by side: {', '.join(LAYOUTS)}"
        },
    )
    out: str = dataclasses.field(
        default=str(Path.home() / ".cache/treadle/bench/dataplane_scheduler_overhead"),
        metadata={"help": "output dir"},
    )


class Timeline:
    """Per-turn timestamps: observation ready, action delivered, engine call time."""

    def __init__(self) -> None:
        self.obs_ready: dict[str, float] = {}
        self.engine_start: dict[tuple[str, int], float] = {}
        self.engine_s: dict[tuple[str, int], float] = {}
        self.overheads: list[float] = []
        self.turn_of: dict[str, int] = {}

    def action(self, tid: str) -> None:
        now = time.perf_counter()
        turn = self.turn_of.get(tid, 0)
        self.turn_of[tid] = turn + 1
        engine = self.engine_s.pop((tid, turn), None)
        if engine is not None and tid in self.obs_ready:
            self.overheads.append(now - self.obs_ready[tid] - engine)


class Env:
    def __init__(self, cfg: Config, timeline: Timeline) -> None:
        self.cfg, self.timeline = cfg, timeline
        self.rng = random.Random(cfg.seed)
        self.steps: dict[str, int] = {}

    async def open(
        self, *, env: str, session_id: str, seed: int, options: dict[str, Any] | None = None
    ) -> env_protocol.Observation:
        await asyncio.sleep(self.rng.uniform(0, self.cfg.env_max_s))
        self.steps[session_id] = 0
        self.timeline.obs_ready[session_id] = time.perf_counter()
        return env_protocol.Observation(
            session_id=session_id, observation="Compute 2 + 2.", info={"reward_fn": "x"}
        )

    async def step(self, session_id: str, action: str) -> env_protocol.StepResult:
        self.timeline.action(session_id)
        await asyncio.sleep(self.rng.uniform(0, self.cfg.env_max_s))
        self.steps[session_id] += 1
        self.timeline.obs_ready[session_id] = time.perf_counter()
        return env_protocol.StepResult(observation="ok", done=self.steps[session_id] >= self.cfg.turns)

    async def close(self, session_id: str) -> None:
        self.steps.pop(session_id, None)


class Reward:
    async def score(self, req: reward_protocol.ScoreRequest) -> reward_protocol.ScoreResult:
        return reward_protocol.ScoreResult(
            trajectory_id=req.trajectory_id, reward=0.0, details={}, cached=False
        )


class InstantAgent:
    """No agent, no engine: answers after the engine's time, for the scheduler-only figure."""

    def __init__(self, cfg: Config, timeline: Timeline) -> None:
        self.delay_s, self.timeline, self.tokens = (
            cfg.step_ms * cfg.max_tokens / 1000,
            timeline,
            cfg.max_tokens,
        )

    async def generate(self, req: agent_protocol.GenerateRequest) -> agent_protocol.GenerateResult:
        began = time.perf_counter()
        await asyncio.sleep(self.delay_s)
        self.timeline.engine_s[(req.trajectory_id, req.turn)] = time.perf_counter() - began
        n = self.tokens
        return agent_protocol.GenerateResult(
            trajectory_id=req.trajectory_id,
            text="x" * n,
            prompt_token_ids=[1] * 32,
            output_token_ids=[2] * n,
            output_logprobs=[-0.5] * n,
            output_versions=[0] * n,
            finish_reason="length",
        )

    async def abort(self, trajectory_id: str) -> bool:
        return False


class InProcessAgent:
    """The real ``AgentService`` behind the scheduler's ``Agent`` interface, minus the HTTP hop."""

    def __init__(self, svc: agent_service.AgentService) -> None:
        self.svc = svc

    async def generate(self, req: agent_protocol.GenerateRequest) -> agent_protocol.GenerateResult:
        return await self.svc.generate(req)

    async def abort(self, trajectory_id: str) -> bool:
        return self.svc.abort(trajectory_id)


class Timed:
    """Records the engine time the agent reports for each turn (``GenerateResult.engine_seconds``)."""

    def __init__(self, agent: scheduler_protocol.Agent, timeline: Timeline) -> None:
        self.agent, self.timeline = agent, timeline

    async def generate(self, req: agent_protocol.GenerateRequest) -> agent_protocol.GenerateResult:
        result = await self.agent.generate(req)
        self.timeline.engine_s[(req.trajectory_id, req.turn)] = result.engine_seconds
        return result

    async def abort(self, trajectory_id: str) -> bool:
        return await self.agent.abort(trajectory_id)


class GcPauses:
    """Cyclic-GC pauses of this process while installed (``gc.callbacks``), per generation: wall time
    (what a turn waits; it includes time the OS ran other processes) and this thread's CPU time."""

    def __init__(self) -> None:
        self.pauses: dict[int, list[float]] = {0: [], 1: [], 2: []}
        self.cpu_s = {0: 0.0, 1: 0.0, 2: 0.0}
        self._began = self._began_cpu = 0.0

    def __enter__(self) -> GcPauses:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._began, self._began_cpu = time.perf_counter(), time.thread_time()
        else:
            self.pauses[info["generation"]].append(time.perf_counter() - self._began)
            self.cpu_s[info["generation"]] += time.thread_time() - self._began_cpu

    def summary(self) -> dict[str, dict[str, float]]:
        return {
            f"gen{g}": {
                "count": len(p),
                "total_ms": 1e3 * sum(p),
                "max_ms": 1e3 * max(p, default=0.0),
                "cpu_ms": 1e3 * self.cpu_s[g],
            }
            for g, p in self.pauses.items()
        }


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def main(cfg: Config) -> dict[str, Any]:
    timeline = Timeline()
    n = cfg.engines if cfg.agent == "real" else 1
    with tempfile.TemporaryDirectory() as tmp, stack_mod.Stack(Path(tmp)) as stack:
        # Twice the mean share: placement's sticky least-loaded routing leaves some engines fuller.
        seqs = -(-2 * cfg.in_flight // n)
        agents: dict[str, scheduler_protocol.Agent] = {}
        services: list[agent_service.AgentService] = []
        clients: list[agent_client.AgentClient] = []
        engine_args = ["--step-ms", str(cfg.step_ms), "--max-num-seqs", str(seqs), "--eos-probability", "0"]
        engines = await asyncio.gather(
            *(
                stack.start(f"engine{i}", "treadle.services.fakevllm", engine_args, kind="http",
                            health_path="/health")
                for i in range(n if cfg.agent == "real" else 0)
            )
        )  # fmt: skip
        if cfg.agent_hop == "http":
            procs = await asyncio.gather(
                *(
                    stack.start(f"agent{i}", "treadle.services.agent",
                                ["--engine-url", engine.url, "--worker-id", f"w{i}"], kind="http")
                    for i, engine in enumerate(engines)
                )
            )  # fmt: skip
            for proc in procs:
                clients.append(agent_client.AgentClient(proc.url))
                agents[proc.url] = Timed(clients[-1], timeline)
        else:
            for i, engine in enumerate(engines):
                svc = agent_service.AgentService(
                    engine_url=engine.url, worker_id=f"w{i}", registry=prometheus_client.CollectorRegistry()
                )
                await svc.start()
                services.append(svc)
                agents[f"in-process-{i}"] = Timed(InProcessAgent(svc), timeline)
        if cfg.agent != "real":
            agents["in-process-0"] = InstantAgent(cfg, timeline)
        placement = placement_service.PlacementService(
            pools={"p": "any"}, tasks={"math": jobconfig.TaskPlacement("decode-heavy")}
        )
        for i, address in enumerate(agents):
            placement.register_worker(placement_pb2.Worker(worker_id=f"w{i}", pool="p", address=address))
        buffer = buffer_service.BufferService(store=store.MemoryStore(), alpha=1)
        task = jobconfig.TaskConfig(
            name="math",
            env="bench",
            group_size=cfg.group_size,
            max_turns=cfg.turns,
            max_tokens=cfg.max_tokens,
        )
        settings = jobconfig.Settings(
            alpha=1, batch_size=cfg.trajectories, max_in_flight=cfg.in_flight, backoff_s=0.05
        )
        sched = scheduler_service.SchedulerService(
            tasks={"math": task},
            settings=settings,
            envs=[Env(cfg, timeline)],
            agent_for=agents.__getitem__,
            placement=placement_service.InProcess(placement),
            reward=Reward(),
            buffer=buffer,
        )
        groups = [
            scheduler_protocol.PromptGroup(group_id=f"g{i}", task="math", seed=i)
            for i in range(cfg.trajectories // cfg.group_size)
        ]
        samples: list[int] = []
        pids = {
            role: [p.popen.pid for name, p in stack.procs.items() if name.startswith(role) and p.popen]
            for role in ("agent", "engine")
        }
        if cfg.pin == "split":
            cores = sorted(os.sched_getaffinity(0))
            os.sched_setaffinity(0, cores[:1])
            for pid in pids["agent"] + pids["engine"]:
                os.sched_setaffinity(pid, cores[1:])
        cpu_before = {role: sum(map(cpu_s, ps)) for role, ps in pids.items()}
        if cfg.gc == "service":
            runtime.settle_heap()
        frozen = gc.get_freeze_count()
        cpu0, wall0 = time.process_time(), time.perf_counter()
        with GcPauses() as gc_pauses:
            await sched.submit(groups)
            deadline = wall0 + 600
            while time.perf_counter() < deadline:
                await asyncio.sleep(0.25)
                stats = sched.stats()
                samples.append(stats.in_flight)
                if scheduler_client.settled(stats):
                    break
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        tracked = len(gc.get_objects())
        cpu_of = {role: sum(map(cpu_s, ps)) - cpu_before[role] for role, ps in pids.items()}
        stats = sched.stats()
        await sched.aclose()
        for svc in services:
            await svc.aclose()
        for client in clients:
            await client.aclose()
    ms = [x * 1000 for x in timeline.overheads]
    overhead = {"median": statistics.median(ms), "p90": pct(ms, 0.90), "p99": pct(ms, 0.99), "max": max(ms)}
    result = {
        "engine": "SIMULATED ENGINE (treadle.services.fakevllm)",
        "agent": cfg.agent,
        "engines": n,
        "agent_hop": cfg.agent_hop if cfg.agent == "real" else "none",
        "pin": cfg.pin,
        "gc": cfg.gc,
        "loop": cfg.loop,
        "turns_measured": len(ms),
        "turns": stats.turns,
        "completed": stats.completed,
        "failed": stats.failed,
        "failed_by_reason": dict(stats.failed_by_reason),
        "in_flight_mean": statistics.mean(samples),
        "in_flight_max": max(samples),
        "turns_per_s": stats.turns / wall,
        "overhead_ms": overhead,
        "cpu_ms_per_turn": 1000 * cpu / max(1, stats.turns),
        "agent_processes_cpu_ms_per_turn": 1000 * cpu_of["agent"] / max(1, stats.turns),
        "engine_processes_cpu_ms_per_turn": 1000 * cpu_of["engine"] / max(1, stats.turns),
        "load_avg_1m_end": os.getloadavg()[0],
        "gc_pauses_this_process": gc_pauses.summary(),
        "gc_objects_frozen": frozen,
        "gc_objects_tracked_at_end": tracked,
        "targets_ms": {"median": TARGET_MEDIAN_MS, "p99": TARGET_P99_MS},
    }
    print(
        f"[SIMULATED ENGINE] {stats.turns} turns of {stats.completed} trajectories ({stats.failed} failed) "
        f"in {wall:.1f}s, {stats.turns / wall:.0f} turns/s; in flight mean {statistics.mean(samples):.0f}, "
        f"max {max(samples)}"
    )
    if stats.failed:
        print(f"failures by reason: {dict(stats.failed_by_reason)}")
    what = (
        f"scheduler+agent ({n} engine(s), agent {cfg.agent_hop}, {cfg.loop}, pin {cfg.pin})"
        if cfg.agent == "real"
        else f"scheduler alone ({cfg.loop})"
    )
    print(
        f"{what}: overhead per turn: median {overhead['median']:.3f} ms, p90 {overhead['p90']:.3f} ms, "
        f"p99 {overhead['p99']:.3f} ms, max {overhead['max']:.1f} ms "
        f"(targets: median < {TARGET_MEDIAN_MS} ms, p99 < {TARGET_P99_MS} ms); "
        f"CPU per turn: this process {result['cpu_ms_per_turn']:.3f} ms, agent processes "
        f"{result['agent_processes_cpu_ms_per_turn']:.3f} ms, simulated engines "
        f"{result['engine_processes_cpu_ms_per_turn']:.3f} ms; load {result['load_avg_1m_end']:.2f}"
    )
    gcs = gc_pauses.summary()
    print(
        f"GC pauses of this process: gen2 {gcs['gen2']['count']:.0f} x, max {gcs['gen2']['max_ms']:.1f} ms, "
        f"total {gcs['gen2']['total_ms']:.0f} ms; gen0+1 total "
        f"{gcs['gen0']['total_ms'] + gcs['gen1']['total_ms']:.0f} ms, max "
        f"{max(gcs['gen0']['max_ms'], gcs['gen1']['max_ms']):.1f} ms; CPU in GC "
        f"{sum(g['cpu_ms'] for g in gcs.values()):.0f} ms of {1000 * cpu:.0f}; objects frozen {frozen}, "
        f"tracked at the end {tracked}"
    )
    return result


def parse() -> Config:
    return benchcli.parse(Config, __doc__)


def run_matrix(cfg: Config) -> None:
    """Each layout in its own interpreter (no heap or loop carried over), then one table."""
    rows = []
    for name in cfg.matrix.split(","):
        flags = {**{f.name.replace("_", "-"): str(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)},
                 **LAYOUTS[name], "matrix": "", "out": str(Path(cfg.out) / name)}  # fmt: skip
        argv = [sys.executable, __file__, *(x for k, v in flags.items() for x in (f"--{k}", v))]
        print(f"== {name}: load {os.getloadavg()[0]:.2f} before", flush=True)
        subprocess.run(argv, check=True)
        rows.append((name, json.loads((Path(cfg.out) / name / "results.json").read_text())))
    print(f"\n[SIMULATED ENGINES] overhead per turn in ms; targets: median < {TARGET_MEDIAN_MS}, "
          f"p99 < {TARGET_P99_MS}. CPU ms per turn: this process, agents, engines. Load at end")  # fmt: skip
    head = ("layout", "median", "p90", "p99", "max", "turns/s", "cpu:sched", "agents", "engines", "gc2 max")
    print(f"{head[0]:18}" + "".join(f"{h:>10}" for h in head[1:]) + f"{'load':>6}")
    for name, r in rows:
        o = r["overhead_ms"]
        cells = (o["median"], o["p90"], o["p99"], o["max"], r["turns_per_s"], r["cpu_ms_per_turn"],
                 r["agent_processes_cpu_ms_per_turn"], r["engine_processes_cpu_ms_per_turn"],
                 r["gc_pauses_this_process"]["gen2"]["max_ms"])  # fmt: skip
        print(f"{name:18}" + "".join(f"{c:10.3f}" for c in cells) + f"{r['load_avg_1m_end']:6.2f}")


if __name__ == "__main__":
    config = parse()
    if config.matrix:
        run_matrix(config)
        sys.exit(0)
    if config.loop == "uvloop":
        import uvloop  # installed with uvicorn's standard extras; only this option needs it

        results = uvloop.run(main(config))
    else:
        results = asyncio.run(main(config))
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(dataclasses.asdict(config), indent=2))
    (out / "results.json").write_text(json.dumps(results, indent=2))
