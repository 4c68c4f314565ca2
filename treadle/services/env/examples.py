"""An example user environment, loadable as ``py:treadle.services.env.examples:SingleTurn``.

It shows the interface ``docs/ENVIRONMENTS.md`` documents (a class called with (seed, options,
context), with async ``reset`` / ``step`` / ``close``) and serves the env service's tests: the
common verl / TRL dataset case, one prompt from a dataset row and one answer, which the reward
gateway scores against the row's reference answer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from treadle import errors
from treadle.data import rows
from treadle.services.env import base


class SingleTurn:
    """One prompt from a dataset row, one answer, scored by the task's reward against the row's answer."""

    def __init__(self, seed: int, options: Mapping[str, Any], ctx: base.Context) -> None:
        row = rows.from_option(options)
        if row is None:
            raise errors.SpecError(
                "needs a dataset row: give the task a dataset", field=f"options.{rows.OPTION}"
            )
        self.row = row

    async def reset(self) -> tuple[str, dict[str, Any]]:
        return self.row.prompt, {} if self.row.answer is None else {"reference": self.row.answer}

    async def step(self, action: str) -> base.Outcome:
        return base.Outcome("", done=True, info={"answer": action})

    async def close(self) -> None:
        return None
