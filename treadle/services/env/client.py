"""Async client of the environment service; the scheduler holds one per env server.

Errors follow ``treadle.services.httputil.client``: ``Unavailable`` (retry with backoff),
``NotFound`` (unknown session), ``SpecError`` (bad input, ``field`` set), ``Conflict``.
"""

from __future__ import annotations

from typing import Any
from urllib import parse

import pydantic

from treadle.services.env import protocol
from treadle.services.httputil import client as http


class EnvClient:
    def __init__(self, base_url: str, *, timeout_s: float = 30.0) -> None:
        self._http = http.new_client(base_url, timeout_s=timeout_s)

    async def open(
        self, *, env: str, session_id: str, seed: int, options: dict[str, Any] | None = None
    ) -> protocol.Observation:
        try:
            req = protocol.OpenRequest(env=env, session_id=session_id, seed=seed, options=options)
        except pydantic.ValidationError as exc:
            raise http.from_validation(exc) from exc
        body = await http.call(self._http, "POST", "/v1/sessions", json=req.model_dump())
        return protocol.Observation.model_validate(body)

    async def step(self, session_id: str, action: str) -> protocol.StepResult:
        body = await http.call(
            self._http,
            "POST",
            f"/v1/sessions/{parse.quote(session_id, safe='')}/step",
            json={"action": action},
        )
        return protocol.StepResult.model_validate(body)

    async def close(self, session_id: str) -> None:
        await http.call(self._http, "DELETE", f"/v1/sessions/{parse.quote(session_id, safe='')}")

    async def stats(self) -> protocol.SessionStats:
        return protocol.SessionStats.model_validate(await http.call(self._http, "GET", "/v1/stats"))

    async def aclose(self) -> None:
        await self._http.aclose()
