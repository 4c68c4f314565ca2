"""Async client of the environment service; the scheduler holds one per env server.

Errors follow ``treadle.services.httputil.client``: ``Unavailable`` (retry with backoff),
``NotFound`` (unknown session), ``SpecError`` (bad input, ``field`` set), ``Conflict``.
"""

from __future__ import annotations

from typing import Any
from urllib import parse

import pydantic

from treadle import errors
from treadle.services.env import protocol
from treadle.services.httputil import client as http


class EnvClient:
    """Numbers each session's steps: a call that raised leaves the number unused, so the caller's
    retry of the same action is the same step and the server applies it once."""

    def __init__(self, base_url: str, *, timeout_s: float = 30.0) -> None:
        self._http = http.new_client(base_url, timeout_s=timeout_s)
        self._next_step: dict[str, int] = {}

    async def open(
        self, *, env: str, session_id: str, seed: int, options: dict[str, Any] | None = None
    ) -> protocol.Observation:
        try:
            req = protocol.OpenRequest(env=env, session_id=session_id, seed=seed, options=options)
        except pydantic.ValidationError as exc:
            raise http.from_validation(exc) from exc
        body = await http.call(self._http, "POST", "/v1/sessions", json=req.model_dump())
        self._next_step.setdefault(session_id, 0)
        return protocol.Observation.model_validate(body)

    async def step(self, session_id: str, action: str, *, index: int | None = None) -> protocol.StepResult:
        """Step ``index`` (default: the session's next) of the session."""
        step = self._next_step.get(session_id, 0) if index is None else index
        try:
            body = await http.call(
                self._http, "POST", f"/v1/sessions/{parse.quote(session_id, safe='')}/step",
                json={"action": action, "step": step},
            )  # fmt: skip
        except errors.NotFound:
            self._next_step.pop(session_id, None)  # the session is gone; nothing to number any more
            raise
        self._next_step[session_id] = step + 1
        return protocol.StepResult.model_validate(body)

    async def close(self, session_id: str) -> None:
        self._next_step.pop(session_id, None)
        await http.call(self._http, "DELETE", f"/v1/sessions/{parse.quote(session_id, safe='')}")

    async def stats(self) -> protocol.SessionStats:
        return protocol.SessionStats.model_validate(await http.call(self._http, "GET", "/v1/stats"))

    async def aclose(self) -> None:
        await self._http.aclose()
