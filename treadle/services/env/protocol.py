"""Wire models of the environment service (session API), used by its routes and by ``EnvClient``."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

SESSION_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,199}$"
MAX_ACTION_CHARS = 256 * 1024


class OpenRequest(BaseModel):
    env: str = Field(
        min_length=1, max_length=253, description="environment name, e.g. math-tool, or py:MODULE:CLASS"
    )
    session_id: str = Field(
        pattern=SESSION_ID_PATTERN, description="caller-chosen id, usually the trajectory id"
    )
    seed: int = Field(ge=0, le=2**63 - 1, description="selects the task deterministically")
    options: dict[str, Any] | None = Field(default=None, description="environment-specific options")


class Observation(BaseModel):
    session_id: str
    observation: str
    done: bool = False
    info: dict[str, Any] = Field(
        default_factory=dict, description="may carry `reference` (expected answer) and `reward_fn` (name)"
    )


class StepRequest(BaseModel):
    action: str = Field(max_length=MAX_ACTION_CHARS, description="the model's output for this turn")
    step: int = Field(
        ge=0, le=1_000_000,
        description="this step's index in the session, from 0; a repeated index is answered, not re-applied",
    )  # fmt: skip


class StepResult(BaseModel):
    observation: str
    done: bool
    reward: float | None = None
    info: dict[str, Any] = Field(default_factory=dict)


class EnvInfo(BaseModel):
    name: str
    description: str


class SessionStats(BaseModel):
    active: int
    opened: int
    failed: int
    max_sessions: int
