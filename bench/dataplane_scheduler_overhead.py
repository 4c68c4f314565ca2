"""Scheduler + agent overhead per turn at ~2,000 trajectories in flight, with the simulated engine.

Measured, not simulated (only the engine is: ``treadle.services.fakevllm``, SIMULATED ENGINE, run as
its own process on 127.0.0.1 and reached over HTTP). In this process: the real ``SchedulerService``
(admission, gate, retries, bookkeeping, batched buffer puts), the real ``PlacementService`` and
``BufferService`` (memory store) called in-process, and the real inference agent
(``AgentService``: request building, engine call, token/logprob/version extraction) called
in-process by the scheduler, so the scheduler -> agent HTTP hop is left out. The environment and
the reward are in-process stand-ins whose own latency (a random delay, to keep trajectories out of
lockstep) is excluded by construction.

Overhead of turn k of a trajectory = (time the scheduler enters ``env.step`` with the action of
turn k) - (time the environment handed back the observation of turn k-1, or of ``open``) - (time
the agent spent inside its HTTP call to the engine for turn k). So it counts everything Treadle
does between an observation and the next action -- gate, placement assign/release, the agent's own
work, event-loop queueing behind the other ~2,000 trajectories -- and nothing the engine or the
environment does. Targets of issue 4: median < 1 ms, p99 < 5 ms. The process CPU time per turn is
printed too.

``--agent none`` replaces agent and engine with an in-process stand-in that answers after the
engine's time, to measure the scheduler alone.

Run: ``python bench/dataplane_scheduler_overhead.py [--agent none]``;
results in ``--out`` (config.json, results.json).
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import dataclasses
import json
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import prometheus_client

from treadle.localmode import stack as stack_mod
from treadle.services.agent import protocol as agent_protocol
from treadle.services.agent import service as agent_service
from treadle.services.buffer import service as buffer_service
from treadle.services.buffer import store
from treadle.services.env import protocol as env_protocol
from treadle.services.placement import service as placement_service
from treadle.services.reward import protocol as reward_protocol
from treadle.services.scheduler import protocol as scheduler_protocol
from treadle.services.scheduler import service as scheduler_service
from treadle.v1 import placement_pb2, scheduler_pb2

TARGET_MEDIAN_MS, TARGET_P99_MS = 1.0, 5.0
current: contextvars.ContextVar[tuple[str, int]] = contextvars.ContextVar("current", default=("", -1))


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
    loop: str = dataclasses.field(
        default="asyncio", metadata={"help": "event loop of this process: asyncio or uvloop"}
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
        current.set((req.trajectory_id, req.turn))  # copied into the agent's task: the hooks read it
        return await self.svc.generate(req)

    async def abort(self, trajectory_id: str) -> bool:
        return self.svc.abort(trajectory_id)


def time_engine_calls(agent: agent_service.AgentService, timeline: Timeline) -> None:
    """Time every engine completion call of ``agent`` (keyed by the turn in ``current``)."""
    inner = agent.engine.request

    async def timed(method: str, path: str, **kwargs: Any) -> Any:
        began = time.perf_counter()
        try:
            return await inner(method, path, **kwargs)
        finally:
            if path == "/v1/chat/completions":
                timeline.engine_s[current.get()] = time.perf_counter() - began

    setattr(agent.engine, "request", timed)  # noqa: B010 - an instance attribute over the bound method


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def main(cfg: Config) -> dict[str, Any]:
    timeline = Timeline()
    with tempfile.TemporaryDirectory() as tmp, stack_mod.Stack(Path(tmp)) as stack:
        engine_args = ["--step-ms", str(cfg.step_ms), "--max-num-seqs", str(cfg.in_flight * 2)]
        engine = await stack.start(
            "engine",
            "treadle.services.fakevllm",
            [*engine_args, "--eos-probability", "0"],
            kind="http",
            health_path="/health",
        )
        agent = agent_service.AgentService(
            engine_url=engine.url, worker_id="w0", registry=prometheus_client.CollectorRegistry()
        )
        await agent.start()
        time_engine_calls(agent, timeline)
        placement = placement_service.PlacementService(
            pools={"p": "any"}, tasks={"math": placement_service.TaskPlacement("decode-heavy")}
        )
        placement.register_worker(placement_pb2.Worker(worker_id="w0", pool="p", address="in-process"))
        buffer = buffer_service.BufferService(store=store.MemoryStore(), alpha=1)
        in_process: scheduler_protocol.Agent = (
            InProcessAgent(agent) if cfg.agent == "real" else InstantAgent(cfg, timeline)
        )
        task = scheduler_protocol.TaskConfig(
            name="math",
            env="bench",
            group_size=cfg.group_size,
            max_turns=cfg.turns,
            max_tokens=cfg.max_tokens,
        )
        settings = scheduler_protocol.Settings(
            alpha=1, batch_size=cfg.trajectories, max_in_flight=cfg.in_flight, backoff_s=0.05
        )
        sched = scheduler_service.SchedulerService(
            tasks={"math": task},
            settings=settings,
            envs=[Env(cfg, timeline)],
            agent_for=lambda address: in_process,
            placement=placement_service.InProcess(placement),
            reward=Reward(),
            buffer=buffer,
        )
        groups = [
            scheduler_pb2.PromptGroup(group_id=f"g{i}", task="math", seed=i)
            for i in range(cfg.trajectories // cfg.group_size)
        ]
        samples: list[int] = []
        cpu0, wall0 = time.process_time(), time.perf_counter()
        await sched.submit(groups)
        deadline = wall0 + 600
        while time.perf_counter() < deadline:
            await asyncio.sleep(0.25)
            stats = sched.stats()
            samples.append(stats.in_flight)
            if stats.completed + stats.failed + stats.aborted == stats.submitted and stats.unsaved == 0:
                break
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        stats = sched.stats()
        await sched.aclose()
        await agent.aclose()
    ms = [x * 1000 for x in timeline.overheads]
    overhead = {"median": statistics.median(ms), "p90": pct(ms, 0.90), "p99": pct(ms, 0.99), "max": max(ms)}
    result = {
        "engine": "SIMULATED ENGINE (treadle.services.fakevllm)",
        "agent": cfg.agent,
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
        "targets_ms": {"median": TARGET_MEDIAN_MS, "p99": TARGET_P99_MS},
    }
    print(
        f"[SIMULATED ENGINE] {stats.turns} turns of {stats.completed} trajectories ({stats.failed} failed) "
        f"in {wall:.1f}s, {stats.turns / wall:.0f} turns/s; in flight mean {statistics.mean(samples):.0f}, "
        f"max {max(samples)}"
    )
    if stats.failed:
        print(f"failures by reason: {dict(stats.failed_by_reason)}")
    what = "scheduler+agent" if cfg.agent == "real" else "scheduler alone"
    print(
        f"{what}: overhead per turn: median {overhead['median']:.3f} ms, p90 {overhead['p90']:.3f} ms, "
        f"p99 {overhead['p99']:.3f} ms, max {overhead['max']:.1f} ms "
        f"(targets: median < {TARGET_MEDIAN_MS} ms, p99 < {TARGET_P99_MS} ms); "
        f"CPU {result['cpu_ms_per_turn']:.3f} ms per turn"
    )
    return result


def parse() -> Config:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for f in dataclasses.fields(Config):
        p.add_argument(f"--{f.name.replace('_', '-')}", type=type(f.default), default=f.default,
                       help=f.metadata["help"])  # fmt: skip
    return Config(**vars(p.parse_args()))


if __name__ == "__main__":
    config = parse()
    if config.loop == "uvloop":
        import uvloop  # installed with uvicorn's standard extras; only this option needs it

        results = uvloop.run(main(config))
    else:
        results = asyncio.run(main(config))
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(dataclasses.asdict(config), indent=2))
    (out / "results.json").write_text(json.dumps(results, indent=2))
