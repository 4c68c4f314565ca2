"""The agent client's weight load (``agent.client._apply``) over vLLM's weight-update routes, against a
recorded engine: the call sequence, a refusal, a lost engine, a session left open, a held version;
and the simulated engine's answer to those routes (vLLM without a weight-transfer engine)."""

from __future__ import annotations

import json
from collections.abc import Callable

import httpx
import pytest

from treadle import errors
from treadle.services.agent import client
from treadle.services.fakevllm import http_app as fake_http

URL = "http://engine"
Answer = Callable[[str, object], httpx.Response]


def _engine(
    answer: Answer | None = None, *, loaded: int = 0
) -> tuple[httpx.AsyncClient, list[tuple[str, object]]]:
    calls: list[tuple[str, object]] = []

    def handle(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        calls.append((request.url.path, body))
        if request.url.path == "/collective_rpc":
            status = {"prefix": "p", "loaded_version": loaded, "healthy": True, "prefetched": [7]}
            return httpx.Response(200, json={"results": [status]})
        if answer is not None:
            return answer(request.url.path, body)
        return httpx.Response(200, json={"message": "ok"})

    return httpx.AsyncClient(transport=httpx.MockTransport(handle)), calls


def _paths(calls: list[tuple[str, object]]) -> list[str]:
    return [path for path, _ in calls if path != "/collective_rpc"]


async def test_a_version_is_loaded_through_start_update_finish_then_the_prefix_cache_is_dropped() -> None:
    http, calls = _engine()
    assert await client._apply(http, URL, 7, "") == "prefetched"
    assert _paths(calls) == [
        "/start_weight_update",
        "/update_weights",
        "/finish_weight_update",
        "/reset_prefix_cache",
    ]
    assert ("/update_weights", {"update_info": {"version": 7}}) in calls
    http, calls = _engine()
    assert await client._apply(http, URL, 3, "planner") == "pulled"  # a move names the agent
    assert ("/update_weights", {"update_info": {"version": 3, "agent": "planner"}}) in calls


async def test_a_refused_version_raises_swap_refused_and_nothing_follows() -> None:
    message = "Call to update_weights method failed: p v7 refused: p/v00000007/bucket00001: digest"

    def refuse(path: str, body: object) -> httpx.Response:
        if path == "/update_weights":
            return httpx.Response(500, json={"error": {"message": message, "code": 500}})
        return httpx.Response(200, json={})

    http, calls = _engine(refuse)
    with pytest.raises(client.SwapRefused, match="bucket00001"):
        await client._apply(http, URL, 7, "")
    # vLLM ended the session itself; the finish is a harmless no-op, and the old cache stays valid.
    assert _paths(calls) == ["/start_weight_update", "/update_weights", "/finish_weight_update"]


async def test_an_engine_gone_is_unavailable() -> None:
    def gone(path: str, body: object) -> httpx.Response:
        raise httpx.ConnectError("refused")

    http, _ = _engine(gone)
    with pytest.raises(errors.Unavailable) as raised:
        await client._apply(http, URL, 7, "")
    assert not isinstance(raised.value, client.SwapRefused)


async def test_a_session_left_open_is_finished_and_started_again() -> None:
    starts: list[int] = []

    def once_open(path: str, body: object) -> httpx.Response:
        if path == "/start_weight_update":
            starts.append(1)
            if len(starts) == 1:
                already = "start_weight_update called while a weight update is already active."
                return httpx.Response(500, json={"error": {"message": already}})
        return httpx.Response(200, json={})

    http, calls = _engine(once_open)
    await client._apply(http, URL, 7, "")
    assert _paths(calls)[:4] == [
        "/start_weight_update",
        "/finish_weight_update",
        "/start_weight_update",
        "/update_weights",
    ]


async def test_a_held_version_is_not_loaded_again() -> None:
    http, calls = _engine(loaded=7)
    assert await client._apply(http, URL, 7, "") == "held"
    assert _paths(calls) == []


async def test_the_simulated_engine_answers_like_vllm_without_a_weight_transfer_engine() -> None:
    app = fake_http.build_app()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=URL) as http:
        for path in ("/start_weight_update", "/update_weights", "/finish_weight_update"):
            r = await http.post(path, json={"update_info": {"version": 1}})
            assert r.status_code == 500
            assert "Weight transfer not configured" in r.json()["error"]["message"]
        with pytest.raises(client.SwapRefused, match="Weight transfer not configured"):
            await client._start_update(http, URL)
