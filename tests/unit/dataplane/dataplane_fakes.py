"""In-process fakes of the scheduler's HTTP dependencies (env, agent, reward) for the unit tier.

The real services are exercised in tests/integration/dataplane; these only let the unit tests pin
the scheduler's own logic without sockets or sleeps.
"""

from __future__ import annotations

import asyncio
from typing import Any

from treadle import errors
from treadle.services.agent import protocol as agent_protocol
from treadle.services.env import protocol as env_protocol
from treadle.services.reward import protocol as reward_protocol


class Env:
    """Done after ``steps`` steps; the first ``fail_open`` opens and ``fail_step`` steps are Unavailable."""

    def __init__(
        self, *, steps: int = 2, fail_open: int = 0, fail_step: int = 0, step_error: Exception | None = None
    ):
        self.steps, self.fail_open, self.fail_step, self.step_error = steps, fail_open, fail_step, step_error
        self.sessions: dict[str, int] = {}
        self.closed: list[str] = []
        self.calls = 0

    async def open(
        self, *, env: str, session_id: str, seed: int, options: dict[str, Any] | None = None
    ) -> env_protocol.Observation:
        self.calls += 1
        if self.fail_open > 0:
            self.fail_open -= 1
            raise errors.Unavailable("env down")
        self.sessions[session_id] = 0
        info = {"reference": str(seed), "reward_fn": "exact"}
        return env_protocol.Observation(session_id=session_id, observation=f"task {seed}", info=info)

    async def step(self, session_id: str, action: str) -> env_protocol.StepResult:
        self.calls += 1
        if self.step_error is not None:
            raise self.step_error
        if self.fail_step > 0:
            self.fail_step -= 1
            raise errors.Unavailable("env down")
        if session_id not in self.sessions:
            raise errors.NotFound(f"session {session_id}")
        self.sessions[session_id] += 1
        done = self.sessions[session_id] >= self.steps
        return env_protocol.StepResult(observation=f"obs {self.sessions[session_id]}", done=done)

    async def close(self, session_id: str) -> None:
        self.sessions.pop(session_id, None)
        self.closed.append(session_id)


class Agent:
    """Answers every turn with two tokens tagged ``version``; ``hold`` makes generate wait until set."""

    def __init__(self, *, version: int = 0, pad: int = 0) -> None:
        self.version = version
        self.pad = pad
        self.hold: asyncio.Event | None = None
        self.started = 0
        self.aborted: list[str] = []
        self.abort_next = 0

    async def generate(self, req: agent_protocol.GenerateRequest) -> agent_protocol.GenerateResult:
        self.started += 1
        if self.hold is not None:
            await self.hold.wait()
        if self.abort_next > 0:
            self.abort_next -= 1
            return agent_protocol.GenerateResult(
                trajectory_id=req.trajectory_id, text="", prompt_token_ids=[], output_token_ids=[],
                output_logprobs=[], output_versions=[], finish_reason="abort",
            )  # fmt: skip
        return agent_protocol.GenerateResult(
            trajectory_id=req.trajectory_id,
            text=f"answer {req.turn}" + "x" * self.pad,
            prompt_token_ids=[1, 2, 3],
            output_token_ids=[7, 8],
            output_logprobs=[-0.5, -0.25],
            output_versions=[self.version] * 2,
            finish_reason="stop",
        )

    async def abort(self, trajectory_id: str) -> bool:
        self.aborted.append(trajectory_id)
        return True


class Reward:
    def __init__(self, *, fail: int = 0) -> None:
        self.fail = fail
        self.scored: list[str] = []

    async def score(self, req: reward_protocol.ScoreRequest) -> reward_protocol.ScoreResult:
        if self.fail > 0:
            self.fail -= 1
            raise errors.Unavailable("reward down")
        self.scored.append(req.trajectory_id)
        return reward_protocol.ScoreResult(
            trajectory_id=req.trajectory_id, reward=1.0, details={}, cached=False
        )
