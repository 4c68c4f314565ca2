"""The rollout section of a RolloutJob's status (``status.rollout``), which the job's scheduler writes
(``treadle.services.scheduler.jobreport``) and ``treadle status`` shows; in a module of its own, as
``external``, and re-exported by ``v1alpha1``."""

from __future__ import annotations

from pydantic import Field

from treadle.api import base


class ReasonCount(base.Model):
    """How many trajectories failed or were aborted for one reason."""

    reason: str = Field(max_length=200)
    """The reason's kind (its stage and call, without ids)."""
    count: int = Field(ge=0)


class RolloutProgress(base.Model):
    """What the job's scheduler has run since it started, written about every 10 s (``treadle status``)."""

    completed: int = Field(default=0, ge=0)
    """Trajectories stored as completed."""
    failed: int = Field(default=0, ge=0)
    aborted: int = Field(default=0, ge=0)
    """Trajectories aborted (stale under the staleness bound, preempted surplus...)."""
    pending: int = Field(default=0, ge=0)
    """Trajectories accepted and waiting for admission."""
    in_flight: int = Field(default=0, ge=0)
    trajectories_per_minute: float = Field(default=0.0, ge=0)
    """Trajectories finished per minute over the last report interval."""
    max_staleness: int = Field(default=0, ge=0)
    """Most versions any stored trajectory's oldest token lagged the committed version by."""
    failures: list[ReasonCount] = Field(default_factory=list, max_length=5)
    """The most frequent reasons of failed or aborted trajectories, most frequent first."""
