"""The reward gateway over HTTP: every built-in function, idempotency, the judge against the simulated
vLLM, user functions, and the error shape."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from treadle import errors
from treadle.sandbox import confine
from treadle.services.httputil import serve
from treadle.services.reward import client as reward_client
from treadle.services.reward import http_app as reward_app
from treadle.services.reward import protocol


def req(tid: str, fn: str, response: str, **kw: object) -> protocol.ScoreRequest:
    return protocol.ScoreRequest.model_validate(
        {"trajectory_id": tid, "reward_fn": fn, "response": response, **kw}
    )


@pytest.mark.parametrize(
    ("request_", "reward"),
    [
        (req("m1", "math", "I used the tool. <answer>1,024</answer>", reference="1024"), 1.0),
        (req("m2", "math", "<answer>1023</answer>", reference="1024"), 0.0),
        (req("e1", "exact", "Paris", reference="paris"), 1.0),
        (
            req(
                "c1",
                "code-tests",
                "```python\ndef sq(x):\n    return x * x\n```",
                reference="assert sq(3) == 9\n",
            ),
            1.0,
        ),
        (
            req(
                "c2",
                "code-tests",
                "```python\ndef sq(x):\n    return x + x\n```",
                reference="assert sq(3) == 9\n",
            ),
            0.0,
        ),
        (req("v1", "env", "", metadata={"env_reward": 1.0}), 1.0),
        (
            req("u1", "py:treadle.services.reward.examples:length_penalty", "", metadata={"max_chars": 10}),
            1.0,
        ),
    ],
    ids=["math-right", "math-wrong", "exact", "code-pass", "code-fail", "env", "user-fn"],
)
async def test_builtin_functions(reward_server: str, request_: protocol.ScoreRequest, reward: float) -> None:
    c = reward_client.RewardClient(reward_server)
    result = await c.score(request_)
    assert (result.trajectory_id, result.reward, result.cached) == (request_.trajectory_id, reward, False)
    await c.aclose()


async def test_llm_judge_calls_an_openai_compatible_endpoint(reward_server: str, fake_vllm: str) -> None:
    c = reward_client.RewardClient(reward_server)
    result = await c.score(req("j1", "llm-judge", "42", reference="42", prompt="6*7?"))
    assert 0.0 <= result.reward <= 1.0 and "verdict" in result.details
    async with httpx.AsyncClient(base_url=fake_vllm) as h:
        text = (await h.get("/metrics")).text
    assert (
        'vllm:request_success_total{engine="0",finished_reason="length",model_name="simulated-llm"} 1.0'
        in text
    )
    await c.aclose()


async def test_idempotent_per_trajectory_even_when_concurrent(reward_server: str) -> None:
    c = reward_client.RewardClient(reward_server)
    r = req(
        "same", "code-tests", "```python\ndef sq(x):\n    return x * x\n```", reference="assert sq(2) == 4\n"
    )
    results = await asyncio.gather(*(c.score(r) for _ in range(6)))
    assert [x.reward for x in results] == [1.0] * 6
    assert sorted(x.cached for x in results) == [False] + [True] * 5  # computed once
    with pytest.raises(errors.Conflict):
        await c.score(r.model_copy(update={"response": "other"}))
    await c.aclose()


async def test_bad_requests_name_the_field_and_store_nothing(reward_server: str) -> None:
    c = reward_client.RewardClient(reward_server)
    cases = [
        (req("b1", "no-such-fn", "x"), "reward_fn"),
        (req("b2", "math", "x"), "reference"),
        (req("b3", "env", "x"), "metadata.env_reward"),
        (req("b4", "py:os:system", "x"), "reward_fn"),
    ]
    for bad, field in cases:
        with pytest.raises(errors.SpecError) as exc:
            await c.score(bad)
        assert exc.value.field == field
    # the same ids are free for a valid request afterwards: nothing was cached for them
    ok = await c.score(req("b2", "math", "<answer>1</answer>", reference="1"))
    assert (ok.reward, ok.cached) == (1.0, False)
    async with httpx.AsyncClient(base_url=reward_server) as h:
        r = await h.post("/v1/score", json={"trajectory_id": "", "reward_fn": "math", "response": "x"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "trajectory_id"
    await c.aclose()


async def test_without_a_sandbox_code_tests_is_refused_with_the_reason_and_math_still_scores(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Root without CAP_SETUID & co. (capabilities reported missing): no mode can run, so none does.
    monkeypatch.setattr(confine, "capable", lambda *caps: False)
    async with serve.running(reward_app.build_app(timeout_s=5)) as url:
        c = reward_client.RewardClient(url)
        try:
            assert (await c.score(req("m", "math", "<answer>4</answer>", reference="4"))).reward == 1.0
            code = req("c", "code-tests", "def sq(x):\n    return x * x\n", reference="assert sq(3) == 9")
            with pytest.raises(errors.Unavailable, match=r"cannot run here: .*lacks CAP_SETUID"):
                await c.score(code)
        finally:
            await c.aclose()
