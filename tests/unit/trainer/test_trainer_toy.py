"""The toy task's reward, directly and through the reward gateway's user-function resolver."""

from __future__ import annotations

import pytest

from treadle import errors
from treadle.services.reward import functions, protocol
from treadle.trainer import toy


@pytest.mark.parametrize(
    "text,expected", [("", 0.0), ("aaaa", 1.0), ("abab", 0.5), ("an apple", 0.25), ("xyz", 0.0)]
)
def test_reward_is_the_fraction_of_target_characters(text: str, expected: float) -> None:
    assert toy.reward(text) == pytest.approx(expected)


async def test_gateway_resolves_and_scores_it() -> None:
    res = functions.Resources(user_prefixes=("treadle.trainer",))
    fn = functions.resolve("py:treadle.trainer.toy:score", res)
    reward, details = await fn(
        protocol.ScoreRequest(trajectory_id="t1", reward_fn="py:treadle.trainer.toy:score", response="aab"),
        res,
    )
    assert reward == pytest.approx(2 / 3)
    assert details == {"target": "a", "chars": 3, "hits": 2}


def test_gateway_refuses_it_without_the_prefix() -> None:
    with pytest.raises(errors.SpecError):
        functions.resolve("py:treadle.trainer.toy:score", functions.Resources())
