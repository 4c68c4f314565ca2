"""Property tests: malformed input to every edge app gets the error shape, never a 5xx, and stores nothing.

Bodies are random JSON values and valid bodies with one field replaced by random JSON or removed.
Servers run on 127.0.0.1 for the whole test; Hypothesis drives requests from a private event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import urllib.parse
from collections.abc import Awaitable, Iterator
from typing import Any, TypeVar

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from treadle.services.agent import http_app as agent_app
from treadle.services.env import http_app as env_app
from treadle.services.fakevllm import engine
from treadle.services.fakevllm import http_app as fake_app
from treadle.services.httputil import serve
from treadle.services.reward import http_app as reward_app

T = TypeVar("T")
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def mutated(valid: dict[str, Any]) -> st.SearchStrategy[Any]:
    """A valid body with one field replaced by arbitrary JSON or dropped, or arbitrary JSON outright."""
    keys = sorted(valid)
    replace = st.tuples(st.sampled_from(keys), JSON).map(lambda kv: {**valid, kv[0]: kv[1]})
    drop = st.sampled_from(keys).map(lambda k: {key: v for key, v in valid.items() if key != k})
    return st.one_of(replace, drop, JSON)


class Loop:
    """One event loop for a whole property test, so servers outlive single examples."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.stack = contextlib.AsyncExitStack()
        self._http: httpx.AsyncClient | None = None

    def run(self, aw: Awaitable[T]) -> T:
        return self.loop.run_until_complete(aw)

    def serve(self, app: Any) -> str:
        return self.run(self.stack.enter_async_context(serve.running(app)))

    def close(self) -> None:
        self.run(self.http.aclose())
        self.run(self.stack.aclose())
        self.loop.close()

    @property
    def http(self) -> httpx.AsyncClient:
        # One pooled client for the whole test: a connection per request would dominate the run time.
        if self._http is None:
            self._http = httpx.AsyncClient(timeout=30)
        return self._http


@pytest.fixture
def loop() -> Iterator[Loop]:
    lp = Loop()
    try:
        yield lp
    finally:
        lp.close()


def check_error_shape(response: httpx.Response) -> None:
    assert response.status_code < 500, response.text
    if response.status_code >= 400:
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["code"] == response.status_code
        assert error["message"]


def post(loop: Loop, url: str, body: Any) -> httpx.Response:
    return loop.run(loop.http.post(url, json=body))


def get_json(loop: Loop, url: str) -> Any:
    return loop.run(loop.http.get(url)).json()


def test_env_open_and_step(loop: Loop) -> None:
    url = loop.serve(env_app.build_app())
    valid_open = {"env": "math-tool", "session_id": "keep", "seed": 1, "options": {"max_turns": 3}}
    assert post(loop, url + "/v1/sessions", valid_open).status_code == 200

    @SETTINGS
    @given(body=mutated(valid_open | {"session_id": "probe"}), step=mutated({"action": "x", "step": 0}))
    def probe(body: Any, step: Any) -> None:
        before = get_json(loop, url + "/v1/stats")
        r = post(loop, url + "/v1/sessions", body)
        check_error_shape(r)
        after = get_json(loop, url + "/v1/stats")
        if r.status_code == 200:  # the mutation happened to be valid: undo it (its id may be another)
            opened = r.json()["session_id"]
            if opened != "keep":
                loop.run(loop.http.delete(url + "/v1/sessions/" + urllib.parse.quote(opened, safe="")))
        else:
            assert after == before
        s = post(loop, url + "/v1/sessions/keep/step", step)
        check_error_shape(s)
        if s.status_code >= 400:
            assert get_json(loop, url + "/v1/stats")["active"] == before["active"]

    probe()


def test_reward_score(loop: Loop) -> None:
    url = loop.serve(reward_app.build_app())
    valid = {"trajectory_id": "t", "reward_fn": "math", "response": "<answer>2</answer>", "reference": "2"}

    @SETTINGS
    @given(body=mutated(valid))
    def probe(body: Any) -> None:
        r = post(loop, url + "/v1/score", body)
        check_error_shape(r)

    probe()
    # everything above was either a valid score of "t" or refused; a fresh id scores normally
    fresh = post(loop, url + "/v1/score", {**valid, "trajectory_id": "fresh"})
    assert fresh.json()["cached"] is False and fresh.json()["reward"] == 1.0


def test_agent_generate_and_abort(loop: Loop) -> None:
    sim = engine.SimulatedEngine(max_model_len=512)
    engine_url = loop.serve(fake_app.build_app(engine=sim))
    url = loop.serve(agent_app.build_app(engine_url=engine_url, worker_id="w"))
    valid = {
        "trajectory_id": "t",
        "turn": 0,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 4,
    }

    @SETTINGS
    @given(body=mutated(valid), abort=mutated({"trajectory_id": "t"}))
    def probe(body: Any, abort: Any) -> None:
        r = post(loop, url + "/v1/generate", body)
        check_error_shape(r)
        check_error_shape(post(loop, url + "/v1/abort", abort))
        assert get_json(loop, url + "/v1/load")["running"] == 0  # nothing left in flight

    probe()


def test_simulated_vllm_chat(loop: Loop) -> None:
    sim = engine.SimulatedEngine(max_model_len=512)
    url = loop.serve(fake_app.build_app(engine=sim))
    valid = {"model": "simulated-llm", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}

    @SETTINGS
    @given(body=mutated(valid))
    def probe(body: Any) -> None:
        check_error_shape(post(loop, url + "/v1/chat/completions", body))
        assert not sim.running and sim.waiting == 0 and sim.kv_tokens == 0

    probe()
