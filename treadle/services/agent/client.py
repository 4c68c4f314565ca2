"""Async client of the inference agent; the scheduler sends each trajectory turn through it (ADD/ABORT).

``generate`` returns ``finish_reason="abort"`` (no tokens) when the turn was aborted, by ``abort`` or
by a ``pause(mode="abort")``; the caller re-issues the turn later.
"""

from __future__ import annotations

from typing import Literal

from treadle.services.agent import protocol
from treadle.services.httputil import client as http


class AgentClient:
    def __init__(self, base_url: str, *, timeout_s: float = 120.0) -> None:
        self._http = http.new_client(base_url, timeout_s=timeout_s)

    async def generate(self, req: protocol.GenerateRequest) -> protocol.GenerateResult:
        # pydantic-core encodes and parses in one pass each (~4x cheaper than dicts through the json module).
        body = await http.call_raw(self._http, "POST", "/v1/generate", content=req.model_dump_json().encode())
        return protocol.GenerateResult.model_validate_json(body)

    async def abort(self, trajectory_id: str) -> bool:
        body = await http.call(self._http, "POST", "/v1/abort", json={"trajectory_id": trajectory_id})
        return bool(protocol.AbortResult.model_validate(body).aborted)

    async def load(self) -> protocol.WorkerLoad:
        return protocol.WorkerLoad.model_validate(await http.call(self._http, "GET", "/v1/load"))

    async def pause(self, mode: Literal["abort", "wait", "keep"] = "keep", *, expect_agent: str = "") -> str:
        """Start a swap and return its id; ``Conflict`` while another is under way, or if the engine
        serves another agent than ``expect_agent``."""
        body = await http.call(
            self._http, "POST", "/v1/pause", json={"mode": mode, "expect_agent": expect_agent}
        )
        return str(body["swap_id"])

    async def resume(self, pool: str = "", agent: str = "", *, swap_id: str = "") -> None:
        """End the swap ``swap_id`` (empty: whichever is under way); ``pool`` and ``agent`` name what a
        rebalancing move just gave this worker."""
        await http.call(
            self._http, "POST", "/v1/resume", json={"pool": pool, "agent": agent, "swap_id": swap_id}
        )

    async def aclose(self) -> None:
        await self._http.aclose()
