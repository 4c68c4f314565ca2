"""A job with ``spec.reward.type: external``: the real gateway forwards every score request to a real
external scoring service on 127.0.0.1 and keeps idempotency, error mapping and retries in front of it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import fastapi
import pytest

from treadle import errors
from treadle.services.httputil import serve
from treadle.services.reward import client as reward_client
from treadle.services.reward import http_app as reward_app
from treadle.services.reward import protocol


class Scorer:
    """The external service: scores by equality with the reference; its failure mode is switchable."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.mode = "ok"

    def app(self) -> fastapi.FastAPI:
        app = fastapi.FastAPI()

        @app.post("/score")
        async def score(body: dict[str, Any]) -> fastapi.Response:
            self.calls.append(body)
            if self.mode == "down":
                return fastapi.responses.JSONResponse({"detail": "warming up"}, status_code=503)
            if self.mode == "garbage":
                return fastapi.responses.JSONResponse({"score": "high"})
            if body["reward_fn"] != "judge-v2":
                return fastapi.responses.JSONResponse({"detail": "unknown rubric"}, status_code=404)
            right = body["response"].strip() == (body["reference"] or "").strip()
            return fastapi.responses.JSONResponse(
                {"reward": 1.0 if right else 0.25, "details": {"rubric": body["reward_fn"]}}
            )

        return app


@pytest.fixture
def scorer() -> Scorer:
    return Scorer()


@pytest.fixture
async def gateway(scorer: Scorer) -> AsyncIterator[reward_client.RewardClient]:
    async with (
        serve.running(scorer.app()) as external,
        serve.running(reward_app.build_app(external_url=f"{external}/score", timeout_s=5)) as url,
    ):
        client = reward_client.RewardClient(url)
        yield client
        await client.aclose()


def req(tid: str, fn: str = "judge-v2", response: str = "42", reference: str = "42") -> protocol.ScoreRequest:
    return protocol.ScoreRequest(
        trajectory_id=tid, reward_fn=fn, response=response, reference=reference, metadata={"turns": 3}
    )


async def test_every_request_is_forwarded_once_and_the_score_is_idempotent(
    gateway: reward_client.RewardClient, scorer: Scorer
) -> None:
    first = await gateway.score(req("t1"))
    again = await gateway.score(req("t1"))
    wrong = await gateway.score(req("t2", response="41"))
    assert (first.reward, first.cached, again.reward, again.cached) == (1.0, False, 1.0, True)
    assert first.details == {"rubric": "judge-v2", "source": "external"}
    assert wrong.reward == 0.25
    assert [c["trajectory_id"] for c in scorer.calls] == ["t1", "t2"]
    assert scorer.calls[0]["metadata"] == {"turns": 3} and scorer.calls[0]["reward_fn"] == "judge-v2"


async def test_a_refusal_is_bad_input_and_nothing_is_cached(
    gateway: reward_client.RewardClient, scorer: Scorer
) -> None:
    with pytest.raises(errors.SpecError) as caught:
        await gateway.score(req("t1", fn="no-such-rubric"))
    assert caught.value.field == "reward_fn" and "unknown rubric" in str(caught.value)
    assert (await gateway.score(req("t1"))).reward == 1.0  # a corrected request for the same id scores


@pytest.mark.parametrize("mode", ["down", "garbage"])
async def test_an_unusable_answer_is_retryable_and_the_retry_scores(
    gateway: reward_client.RewardClient, scorer: Scorer, mode: str
) -> None:
    scorer.mode = mode
    with pytest.raises(errors.Unavailable):
        await gateway.score(req("t1"))
    scorer.mode = "ok"
    result = await gateway.score(req("t1"))
    assert (result.reward, result.cached, len(scorer.calls)) == (1.0, False, 2)
