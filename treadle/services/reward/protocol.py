"""Wire models of the reward gateway, used by its routes and by ``RewardClient``."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

MAX_TEXT_CHARS = 1024 * 1024
ANY_FUNCTION = "*"
"""The one name ``/v1/functions`` lists when every request goes to an external service."""


class ScoreRequest(BaseModel):
    trajectory_id: str = Field(min_length=1, max_length=200, description="scores are idempotent per id")
    reward_fn: str = Field(
        min_length=1, max_length=200, description="a registered name, or `py:module:function`"
    )
    response: str = Field(max_length=MAX_TEXT_CHARS, description="the text to score (final answer, code...)")
    reference: str | None = Field(
        default=None, max_length=MAX_TEXT_CHARS, description="expected answer/tests"
    )
    prompt: str | None = Field(default=None, max_length=MAX_TEXT_CHARS)
    metadata: dict[str, Any] = Field(default_factory=dict)


class ScoreResult(BaseModel):
    trajectory_id: str
    reward: float
    details: dict[str, Any] = Field(default_factory=dict)
    cached: bool = False


class RewardFnInfo(BaseModel):
    name: str
    description: str
