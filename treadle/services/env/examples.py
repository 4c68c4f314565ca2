"""Example user environments, loadable as ``py:treadle.services.env.examples:SingleTurn`` (and
``:WebSearch``, a tool-calling one whose search API is under a job's quota).

It shows the interface ``docs/ENVIRONMENTS.md`` documents (a class called with (seed, options,
context), with async ``reset`` / ``step`` / ``close``) and serves the env service's tests: the
common verl / TRL dataset case, one prompt from a dataset row and one answer, which the reward
gateway scores against the row's reference answer.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import httpx

from treadle import errors
from treadle.data import rows
from treadle.services.env import base

SEARCH = re.compile(r"<search>(.*?)</search>", re.DOTALL)
ANSWER = re.compile(r".*<answer>(.*?)</answer>.*", re.DOTALL)


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


class WebSearch:
    """Answer a question with a web-search tool: ``<search>QUERY</search>`` calls the search API
    (``options.search_url``, GET ``/search?q=``), ``<answer>TEXT</answer>`` ends the episode.

    The search tool is what ``spec.externalResources.apiQuotas`` names ``web-search`` (the SWE
    example's quota): the env declares it per action (``base.UsesTools``), so the env service holds
    the job's quota before the call and the API never sees more than the quota allows.
    """

    TOOL = "web-search"

    def __init__(self, seed: int, options: Mapping[str, Any], ctx: base.Context) -> None:
        base.check_keys(options, {"search_url", "max_turns"})
        url = options.get("search_url")
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise errors.SpecError("must be the search API's http(s) URL", field="options.search_url")
        self.max_turns = base.int_option(options, "max_turns", 4, lo=1, hi=64)
        self.seed, self.turns = seed, 0
        self.http = httpx.AsyncClient(base_url=url, timeout=30.0)

    def tools_for(self, action: str) -> list[str]:
        return [self.TOOL] if SEARCH.search(action) else []

    async def reset(self) -> tuple[str, dict[str, Any]]:
        return f"Question {self.seed}: search, then answer.", {}

    async def step(self, action: str) -> base.Outcome:
        self.turns += 1
        if (found := SEARCH.search(action)) is not None:
            reply = await self.http.get("/search", params={"q": found.group(1)})
            reply.raise_for_status()
            results = reply.json()["results"]
            return base.Outcome("\n".join(results), done=self.turns >= self.max_turns)
        return base.Outcome("", done=True, info={"answer": ANSWER.sub(r"\1", action)})

    async def close(self) -> None:
        await self.http.aclose()
