"""Answer extraction and the built-in reward functions that need no sandbox or network."""

from __future__ import annotations

from typing import Any

import pytest

from treadle import errors
from treadle.api import jobconfig, v1alpha1
from treadle.services.reward import __main__ as reward_main
from treadle.services.reward import functions, protocol

RES = functions.Resources(user_prefixes=("treadle.services.reward.examples",))


def req(**kw: Any) -> protocol.ScoreRequest:
    return protocol.ScoreRequest(trajectory_id="t", **{"reward_fn": "math", "response": "", **kw})


@pytest.mark.parametrize(
    ("text", "answer", "method"),
    [
        ("work... <answer>42</answer>", "42", "answer-tag"),
        ("<answer>1</answer> then <answer>2</answer>", "2", "answer-tag"),  # the last one counts
        ("so $\\boxed{3/4}$", "3/4", "boxed"),
        ("The answer is 17.", "17.", "answer-is"),
        ("first 3 then 5", "5", "last-number"),
        ("no digits", "no digits", "whole-text"),
    ],
    ids=["tag", "last-tag", "boxed", "answer-is", "last-number", "none"],
)
def test_extract_answer(text: str, answer: str, method: str) -> None:
    assert functions.extract_answer(text) == (answer, method)


@pytest.mark.parametrize(
    ("response", "reference", "reward", "match"),
    [
        ("<answer>3023</answer>", "3023", 1.0, "exact"),
        ("<answer>3,023</answer>", "3023", 1.0, "numeric"),
        ("The answer is 0.5", "1/2", 1.0, "numeric"),
        ("<answer>3024</answer>", "3023", 0.0, "none"),
        ("<answer>inf</answer>", "1", 0.0, "none"),
    ],
    ids=["exact", "thousands-separator", "fraction-vs-decimal", "wrong", "inf-is-not-a-number"],
)
async def test_math_reward(response: str, reference: str, reward: float, match: str) -> None:
    got, details = await functions.score_math(req(response=response, reference=reference), RES)
    assert (got, details["match"]) == (reward, match)


async def test_math_without_reference_names_the_field() -> None:
    with pytest.raises(errors.SpecError) as exc:
        await functions.score_math(req(response="1"), RES)
    assert exc.value.field == "reference"


async def test_exact_and_env_rewards() -> None:
    assert (await functions.score_exact(req(reward_fn="exact", response=" Paris. ", reference="paris"), RES))[
        0
    ] == 1.0
    assert (await functions.score_env(req(reward_fn="env", metadata={"env_reward": 0.25}), RES))[0] == 0.25
    with pytest.raises(errors.SpecError, match="env_reward"):
        await functions.score_env(req(reward_fn="env", metadata={"env_reward": True}), RES)


@pytest.mark.parametrize(
    ("response", "reference", "reward"),
    [("aaab", "a", 0.75), ("", "a", 0.0), ("bbb", " a\n", 0.0), ("aa", "a", 1.0)],
    ids=["three-of-four", "empty", "reference-stripped", "all"],
)
async def test_letter_fraction_scores_the_rows_target_letter(
    response: str, reference: str, reward: float
) -> None:
    fn = functions.resolve("letter-fraction", RES)  # a built-in: a RolloutJob can name it
    got, details = await fn(req(reward_fn="letter-fraction", response=response, reference=reference), RES)
    assert got == reward and details["target"] == "a"


@pytest.mark.parametrize("reference", [None, "ab", ""], ids=["none", "two-letters", "empty"])
async def test_letter_fraction_needs_one_letter(reference: str | None) -> None:
    with pytest.raises(errors.SpecError) as exc:
        await functions.score_letter_fraction(
            req(reward_fn="letter-fraction", response="a", reference=reference), RES
        )
    assert exc.value.field == "reference"


async def test_user_functions_sync_and_async() -> None:
    fn = functions.resolve("py:treadle.services.reward.examples:length_penalty", RES)
    assert (await fn(req(response="x" * 250, metadata={"max_chars": 1000}), RES))[0] == 0.75
    fn = functions.resolve("py:treadle.services.reward.examples:contains_reference", RES)
    assert await fn(req(response="it is 42", reference="42"), RES) == (1.0, {"contains": True})


@pytest.mark.parametrize(
    "name",
    [
        "nope",
        "py:os:system",
        "py:treadle.services.reward.examples",
        "py:treadle.services.reward.examples:missing",
    ],
    ids=["unknown", "prefix-not-allowed", "no-function", "missing-function"],
)
def test_resolve_refuses(name: str) -> None:
    with pytest.raises(errors.SpecError) as exc:
        functions.resolve(name, RES)
    assert exc.value.field == "reward_fn"


@pytest.mark.parametrize(
    ("reward", "expected"),
    [
        (None, (None, None)),
        ({"type": "rule", "url": "http://x"}, (None, None)),
        ({"type": "llm-judge", "url": "http://j", "judgeModel": "m"}, ("http://j", None)),
        ({"type": "external", "url": "http://e"}, (None, "http://e")),
    ],
    ids=["nothing", "rule-ignores-url", "judge", "external"],
)
def test_the_job_url_goes_to_the_function_its_type_names(
    reward: dict[str, str] | None, expected: tuple[str | None, str | None]
) -> None:
    job = jobconfig.reward_config(v1alpha1.Reward.model_validate(reward)) if reward else None
    assert reward_main.endpoints(job) == expected
