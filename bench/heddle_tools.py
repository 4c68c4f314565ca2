"""math-tool with a slow tool, for the Heddle benches' agentic regime (``--tool-s``).

SIMULATED TOOL LATENCY: every step that continues the episode (a tool call, in the paper's terms)
answers after ``options.tool_s`` seconds more, as a remote sandbox, search API or function service is,
seen from the rollout host: a wait that takes no CPU here. Heddle's step-time model (the paper's
``T_rollout = max_i [Q_i + T_tool,i + a_i N_i t_base]``) puts the sum of a trajectory's tool calls on
its critical path; the paper's mean tool times are 0.41-0.46 s (coding), 1.41-1.43 s (search) and
0.05 s (math, Table 1). Everything else is ``treadle.services.env.mathtool`` unchanged.

Loaded by the env service as ``py:heddle_tools:TimedMathTool`` (``--allow-user-module heddle_tools``,
with ``bench/`` on ``PYTHONPATH``, as the benches run).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from treadle import errors
from treadle.services.env import base, mathtool

NAME = "py:heddle_tools:TimedMathTool"
MAX_TOOL_S = 60.0


class TimedMathTool:
    """math-tool whose tool calls take ``options.tool_s`` seconds (SIMULATED latency, module doc)."""

    def __init__(self, seed: int, options: Mapping[str, Any], ctx: base.Context) -> None:
        self.tool_s = tool_seconds(options)
        self.inner = mathtool.SPEC.factory(seed, {k: v for k, v in options.items() if k != "tool_s"}, ctx)

    async def reset(self) -> tuple[str, dict[str, Any]]:
        return await self.inner.reset()

    async def step(self, action: str) -> base.Outcome:
        outcome = await self.inner.step(action)
        if not outcome.done:
            await asyncio.sleep(self.tool_s)
        return outcome

    async def close(self) -> None:
        await self.inner.close()


def tool_seconds(options: Mapping[str, Any]) -> float:
    value = options.get("tool_s", 0.0)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= value <= MAX_TOOL_S:
        raise errors.SpecError(
            f"must be seconds in [0, {MAX_TOOL_S:g}], got {value!r}", field="options.tool_s"
        )
    return float(value)
