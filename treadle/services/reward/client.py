"""Async client of the reward gateway; the scheduler scores each finished trajectory through it.

``score`` is idempotent per ``trajectory_id``, so a retry after ``Unavailable`` is safe; it waits
up to ``connect_wait_s`` for a gateway restarting on its port, saying so in the log.
"""

from __future__ import annotations

from treadle.services.httputil import client as http
from treadle.services.reward import protocol


class RewardClient:
    def __init__(
        self,
        base_url: str,
        *,
        timeout_s: float = 60.0,
        connect_wait_s: float = http.RESTART_WAIT_S,
        token: str | None = None,
    ) -> None:
        self._http = http.new_client(base_url, timeout_s=timeout_s, token=token)
        self.connect_wait_s = connect_wait_s

    async def score(self, req: protocol.ScoreRequest) -> protocol.ScoreResult:
        body = await http.call(
            self._http, "POST", "/v1/score", json=req.model_dump(), connect_wait_s=self.connect_wait_s
        )
        return protocol.ScoreResult.model_validate(body)

    async def functions(self) -> list[protocol.RewardFnInfo]:
        body = await http.call(self._http, "GET", "/v1/functions")
        return [protocol.RewardFnInfo.model_validate(item) for item in body]

    async def aclose(self) -> None:
        await self._http.aclose()
