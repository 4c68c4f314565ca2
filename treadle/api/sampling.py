"""``spec.tasks[].sampling``: how a task samples each prompt's group (standard, redundant, DARTS).

Read by ``treadle.api.v1alpha1.Task`` (the one field that holds it) and, once the live part of DARTS
lands, by the scheduler's translation of the job; the cross-field rules (which fields go with which
mode, ``mUp`` and ``longEnd`` against ``groupSize``) are in ``treadle.api.spec_rules``.

* ``standard``: ``groupSize`` candidates per prompt, all of them trained (GRPO).
* ``redundant``: today's ``tasks[].redundancy`` behaviour, named: extra members are started per
  group. A task with ``redundancy > 0`` and no ``sampling`` is ``redundant``; ``redundancy`` keeps
  working as before.
* ``darts``: DARTS (arXiv 2605.30859, docs/DARTS.md): a per-prompt pool between ``groupSize`` and
  ``mUp`` sized by Alg. 1 within a total budget, dual-end selection of ``groupSize - longEnd``
  shortest plus ``longEnd`` longest valid candidates, shortest-only with early stop for prompts
  whose pool reached ``mUp``. Its fields left out take the defaults below (``settings``).
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from pydantic import Field

from treadle.api import base
from treadle.policy.darts import stats

Mode = Literal["standard", "redundant", "darts"]
Length = Literal["tokens", "turns", "seconds"]
DEFAULT_LONG_END = 1
"""L of the paper's 1:7 split of a group of 8 (DARTS [S], corroborated by its Table 4)."""
DEFAULT_LAMBDA = 0.04
"""Utility per second of rollout in the reconstructed Eq. 8 (ours: the paper gives no value;
``bench/reports/darts.md`` shows how the simulated speedup moves with it)."""


@dataclasses.dataclass(frozen=True)
class DartsSettings:
    """A ``darts`` task's settings with every default filled in (plain values for the policy)."""

    m_up: int
    long_end: int
    lam: float
    ema_decay: float
    keep_unselected: bool = False
    length: Length = "tokens"


class Sampling(base.Model):
    """How each prompt's group is sampled: ``standard``, ``redundant`` or ``darts``."""

    mode: Mode | None = None
    """``standard`` (every candidate trained), ``redundant`` (``redundancy`` extra members per group) or
    ``darts`` (adaptive redundancy, dual-end selection, tail pruning; docs/DARTS.md). Absent:
    ``redundant`` when the task's ``redundancy`` is above 0, else ``standard`` (as before this field)."""
    m_up: int | None = Field(default=None, ge=1, le=4096)
    """DARTS only: most candidates per prompt, where a prompt's budget saturates and it switches to
    shortest-only with early stop; default ``2 × groupSize`` (the paper's)."""
    long_end: int | None = Field(default=None, ge=0, le=1023)
    """DARTS only: longest valid candidates kept per group (``L``; the other ``groupSize - L`` are the
    shortest); default 1, the paper's 1:7 of 8."""
    lam: float | None = Field(default=None, alias="lambda", gt=0.0, le=1000.0)
    """DARTS only: trade-off of the total budget (reconstructed Eq. 8), utility per second of rollout;
    larger is more conservative. Default 0.04 (ours; the paper gives none)."""
    ema_decay: float | None = Field(default=None, ge=0.0, lt=1.0)
    """DARTS only: EMA coefficient of each prompt's response-length variance, weighing epochs;
    default 0.5 (ours; the paper gives none)."""
    keep_unselected: bool | None = None
    """DARTS only: also store the candidates not selected (as ``aborted`` members of their group, so
    the trainer, which takes completed members, still trains on the selected ``groupSize`` only);
    default false: they are counted, not stored."""
    length: Length | None = None
    """DARTS only: what a candidate's length is for selection and statistics: ``tokens`` (total
    generated tokens of the trajectory, the default), ``turns`` or ``seconds`` (wall time, tool
    calls included); docs/DARTS.md says why tokens."""

    def resolved_mode(self, redundancy: float) -> Mode:
        """The mode in force: the one given, else what ``redundancy`` alone meant before this field."""
        if self.mode is not None:
            return self.mode
        return "redundant" if redundancy > 0 else "standard"

    def settings(self, group_size: int) -> DartsSettings:
        """The DARTS settings of a task of ``group_size``, defaults filled in."""
        return DartsSettings(
            m_up=self.m_up if self.m_up is not None else 2 * group_size,
            long_end=self.long_end if self.long_end is not None else DEFAULT_LONG_END,
            lam=self.lam if self.lam is not None else DEFAULT_LAMBDA,
            ema_decay=self.ema_decay if self.ema_decay is not None else stats.DEFAULT_DECAY,
            keep_unselected=bool(self.keep_unselected),
            length=self.length or "tokens",
        )
