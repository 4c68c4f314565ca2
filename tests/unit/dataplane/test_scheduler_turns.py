"""The scheduler's turn loop alone (``turns.TurnLoop``): what it asks of placement, the agent and the
environment for one trajectory, and the one ``finish`` it reports. In-process fakes; the whole
scheduler around it is in test_scheduler."""

from __future__ import annotations

import asyncio
from typing import Any

import dataplane_fakes as fakes
import prometheus_client as prom

from treadle.api import jobconfig, v1alpha1
from treadle.services.agent import protocol as agent_protocol
from treadle.services.placement import protocol as placement_protocol
from treadle.services.scheduler import prediction, protocol, retry, scoring, stats, trajectory, turns

TASK = jobconfig.TaskConfig(name="math", env="e", group_size=1, max_turns=5)


class Placement:
    """One worker; records every call in order."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def assign(self, req: placement_protocol.AssignRequest) -> placement_protocol.Assignment:
        self.calls.append(f"assign {req.turn}")
        return placement_protocol.Assignment("w0", "a0", "p", "least-loaded", "decode-heavy")

    async def release(self, req: placement_protocol.ReleaseRequest) -> None:
        kind = "final" if req.final else f"turn predicted={req.predicted_remaining is not None}"
        self.calls.append(f"release {kind} out={req.output_tokens}")

    async def place_batch(self, req: placement_protocol.PlaceBatchRequest) -> int:
        self.calls.append(f"place {[c.trajectory_id for c in req.trajectories]} gate={req.gate}")
        return len(req.trajectories)


async def run_one(
    env: fakes.Env, agent: fakes.Agent, task: jobconfig.TaskConfig = TASK
) -> tuple[dict[str, Any], trajectory.Traj, Placement]:
    settings = jobconfig.Settings(backoff_s=0.0)
    metrics = stats.SchedulerMetrics(prom.CollectorRegistry())
    tally = stats.Tally(["math"], metrics)
    retrier = retry.Retrier(settings, tally, clock=lambda: 0.0)
    placement = Placement()
    finished: dict[str, Any] = {}
    done = asyncio.Event()

    def finish(t: trajectory.Traj, *, status: str, reason: str, reward: float, prompt: str) -> None:
        finished.update(status=status, reason=reason, reward=reward, prompt=prompt, turns=tally.turns)
        done.set()

    loop = turns.TurnLoop(
        settings=settings, envs=[env], agent_for=lambda address: agent, placement=placement, retrier=retrier,
        rewards=scoring.RewardStage(fakes.Reward(), retrier),
        predictions=prediction.Predictions(["math"], metrics), finish=finish, clock=lambda: 0.0,
    )  # fmt: skip
    t = trajectory.Traj(tid="g-0", work=protocol.Work("g", task, 7, None), init_version=0)
    loop.start([t])
    async with asyncio.timeout(5):
        await done.wait()
    await loop.aclose()
    return finished, t, placement


async def test_a_trajectory_runs_its_turns_through_placement_and_is_finished_once() -> None:
    env = fakes.Env(steps=2)
    finished, t, placement = await run_one(env, fakes.Agent())
    assert finished == {"status": "completed", "reason": "", "reward": 1.0, "prompt": "task 7", "turns": 2}
    assert [turn.text for turn in t.turns] == ["answer 0", "answer 1"] and t.step_tokens == [2, 2]
    assert placement.calls == [
        "place ['g-0'] gate=1000000",  # the global gate (Settings.max_concurrent_generations)
        "assign 0", "release turn predicted=True out=2",
        "assign 1", "release turn predicted=True out=2",
        "release final out=0",
    ]  # fmt: skip
    assert env.closed == ["g-0"]


async def test_an_aborted_generation_is_issued_again_and_a_failed_step_fails_the_trajectory() -> None:
    agent = fakes.Agent()
    agent.abort_next = 1
    env = fakes.Env(steps=2, step_error=RuntimeError("boom"))
    finished, t, placement = await run_one(env, agent)
    assert finished["status"] == "failed" and finished["reason"] == "internal: RuntimeError('boom')"
    # The aborted turn released its worker without a prediction and was generated again.
    assert placement.calls[1:5] == [
        "assign 0", "release turn predicted=False out=0", "assign 0", "release turn predicted=True out=2",
    ]  # fmt: skip
    assert agent.started == 2 and len(t.turns) == 1 and env.closed == ["g-0"]


class RecordingAgent(fakes.Agent):
    def __init__(self) -> None:
        super().__init__()
        self.requests: list[agent_protocol.GenerateRequest] = []

    async def generate(self, req: agent_protocol.GenerateRequest) -> agent_protocol.GenerateResult:
        self.requests.append(req)
        return await super().generate(req)


async def test_the_tasks_stop_sequences_reach_every_generate_request() -> None:
    spec = {
        "agents": [{"name": "a", "model": "m"}],
        "pools": [{"name": "p", "agent": "a", "accelerator": "H20"}],
        "tasks": [{"name": "math", "agents": ["a"], "environment": "e", "reward": "r", "maxTurns": 5,
                   "stop": ["</answer>", "\n\n"]}],
    }  # fmt: skip
    job = v1alpha1.parse_job(
        {"apiVersion": v1alpha1.API_VERSION, "kind": v1alpha1.KIND, "metadata": {"name": "j"}, "spec": spec}
    )
    (task,) = jobconfig.job_config(
        job, max_tokens=64, max_in_flight=8, max_concurrent_generations=4
    ).scheduler.tasks
    assert task.stop == ("</answer>", "\n\n")
    agent = RecordingAgent()
    finished, _, _ = await run_one(fakes.Env(steps=2), agent, task)
    assert finished["status"] == "completed"
    assert [r.stop for r in agent.requests] == [["</answer>", "\n\n"]] * 2
    plain = RecordingAgent()
    await run_one(fakes.Env(steps=1), plain)
    assert [r.stop for r in plain.requests] == [[]]  # none by default: the agent sends no ``stop``
