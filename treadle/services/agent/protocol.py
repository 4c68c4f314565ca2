"""Wire models of the inference agent (the sidecar beside vLLM), used by its routes and ``AgentClient``."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

FinishReason = Literal["stop", "length", "abort"]


class ChatMessage(BaseModel):
    role: Literal["system", "user", "assistant", "tool"]
    content: str = Field(max_length=4 * 1024 * 1024)


class GenerateRequest(BaseModel):
    trajectory_id: str = Field(min_length=1, max_length=200)
    turn: int = Field(
        ge=0, description="turn index within the trajectory; a retried (id, turn) joins the first"
    )
    messages: list[ChatMessage] = Field(min_length=1, max_length=4096)
    max_tokens: int = Field(ge=1, le=1_000_000)
    temperature: float = Field(default=1.0, ge=0.0, le=10.0)
    stop: list[str] = Field(default_factory=list, max_length=16)


class GenerateResult(BaseModel):
    trajectory_id: str
    text: str
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    output_logprobs: list[float]
    output_versions: list[int] = Field(
        description="policy version loaded when each output token was produced"
    )
    finish_reason: FinishReason
    engine_seconds: float = Field(
        default=0.0, description="time of this turn's engine request as the agent saw it (the rest of "
        "the call is Treadle's overhead)",
    )  # fmt: skip


class AbortRequest(BaseModel):
    trajectory_id: str = Field(min_length=1, max_length=200)


class AbortResult(BaseModel):
    trajectory_id: str
    aborted: bool = Field(description="false when nothing was in flight for the trajectory")


class WorkerLoad(BaseModel):
    worker_id: str
    running: int
    waiting: int
    kv_cache_usage: float
    policy_version: int
    healthy: bool
    agent: str = Field(default="", description="the agent whose weights the engine serves (empty: not told)")


class PauseRequest(BaseModel):
    """Starts a weight swap, which the matching resume ends; one swap at a time per worker."""

    mode: Literal["abort", "wait", "keep"] = "keep"
    expect_agent: str = Field(
        default="", max_length=200,
        description="refuse (409) unless the engine serves this agent: the caller read that it does, and "
        "a rebalancing move may have changed it since. Empty: no expectation",
    )  # fmt: skip


class ResumeRequest(BaseModel):
    pool: str = Field(
        default="", max_length=200,
        description="the pool this worker serves from now on (a rebalancing move); the agent registers "
        "with it when placement has forgotten the worker. Empty: unchanged",
    )  # fmt: skip
    agent: str = Field(
        default="", max_length=200,
        description="the agent whose weights the engine serves from now on. Empty: unchanged",
    )  # fmt: skip
    swap_id: str = Field(
        default="", max_length=64,
        description="what the pause answered: resume only that swap (409 if its lease already ended it). "
        "Empty: whichever swap is under way",
    )  # fmt: skip
