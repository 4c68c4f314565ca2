"""The reward functions the gateway knows, by name; ``service`` looks them up per request.

Each function takes the request and the gateway's shared resources and returns (reward, details).
Names: ``math`` (answer extraction + exact or numeric comparison), ``exact``, ``code-tests`` (the
reference is test code, run with the response's code in ``treadle.sandbox``), ``llm-judge`` (any
OpenAI-compatible endpoint), ``env`` (the environment's own reward from ``metadata.env_reward``), and
``letter-fraction`` (the fraction of the response's characters equal to the one-letter reference: the
toy learning task, shaped so that a tiny model learns within a few steps), and
``py:<module>:<function>`` for a user function importable under an allowed module prefix, and
``judge:<name>``: the reward model ``<name>`` of ``spec.externalResources.rewardModels`` grades it as
``llm-judge`` does, on the gateway's own GPUs (``gpus.GpuManager``: one action per GPU chunk).

A gateway started for a job whose ``spec.reward.type`` is ``external`` forwards every request,
whatever its function name, to the job's ``spec.reward.url`` (``score_external``): the external
service owns the names and the scoring, the gateway keeps its idempotency, concurrency limit and
timeout in front of it.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import re
from collections.abc import Awaitable, Callable
from fractions import Fraction
from typing import Any

import httpx

from treadle import errors
from treadle.api import v1alpha1
from treadle.sandbox import codetests, confine, runner
from treadle.services import plugin
from treadle.services.reward import gpus, protocol

Scored = tuple[float, dict[str, Any]]
ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
ANSWER_IS = re.compile(r"answer\s*(?:is|:)\s*([^\n]+)", re.IGNORECASE)
NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?|-?\.\d+")


@dataclasses.dataclass(frozen=True)
class External:
    """The scoring endpoint of a job with ``spec.reward.type: external``."""

    client: httpx.AsyncClient
    url: str


@dataclasses.dataclass(frozen=True)
class Resources:
    sandbox: runner.Sandbox | confine.Unavailable | None = None
    """``confine.Unavailable``: why no sandbox can run here (``code-tests`` says it)."""
    judge: httpx.AsyncClient | None = None
    judge_model: str | None = None
    user_prefixes: tuple[str, ...] = ()
    external: External | None = None
    """Set for a job with ``spec.reward.type: external``: every request is forwarded to its url."""
    reward_models: gpus.GpuManager | None = None
    """Set for a job with ``spec.externalResources.rewardModels``: serves ``judge:<name>``."""


Fn = Callable[[protocol.ScoreRequest, Resources], Awaitable[Scored]]


def extract_answer(text: str) -> tuple[str, str]:
    """(answer, how it was found) from a model response."""
    for method, pattern in (("answer-tag", ANSWER_TAG), ("boxed", BOXED), ("answer-is", ANSWER_IS)):
        found = pattern.findall(text)
        if found:
            return str(found[-1]).strip(), method
    numbers = NUMBER.findall(text)
    return (numbers[-1], "last-number") if numbers else (text.strip(), "whole-text")


def normalize(text: str) -> str:
    return " ".join(text.strip().strip(".").replace("$", "").split()).lower()


def to_number(text: str) -> Fraction | float | None:
    cleaned = normalize(text).replace(",", "").rstrip("%")
    try:
        return Fraction(cleaned)
    except (ValueError, ZeroDivisionError):
        try:
            value = float(cleaned)
        except ValueError:
            return None
        return value if math.isfinite(value) else None


def _need_reference(req: protocol.ScoreRequest) -> str:
    if req.reference is None:
        raise errors.SpecError(f"reward function {req.reward_fn!r} needs a reference", field="reference")
    return req.reference


async def score_math(req: protocol.ScoreRequest, res: Resources) -> Scored:
    reference = _need_reference(req)
    answer, method = extract_answer(req.response)
    details: dict[str, Any] = {"extracted": answer, "method": method, "reference": reference}
    if normalize(answer) == normalize(reference):
        return 1.0, {**details, "match": "exact"}
    got, want = to_number(answer), to_number(reference)
    if (
        got is not None
        and want is not None
        and math.isclose(float(got), float(want), rel_tol=1e-6, abs_tol=1e-9)
    ):
        return 1.0, {**details, "match": "numeric"}
    return 0.0, {**details, "match": "none"}


async def score_exact(req: protocol.ScoreRequest, res: Resources) -> Scored:
    reference = _need_reference(req)
    return (1.0 if normalize(req.response) == normalize(reference) else 0.0), {"reference": reference}


def letter_fraction(text: str, target: str) -> float:
    """Fraction of the characters of ``text`` equal to ``target`` (0 for an empty answer)."""
    return text.count(target) / len(text) if text else 0.0


async def score_letter_fraction(req: protocol.ScoreRequest, res: Resources) -> Scored:
    # Shaped, so that a tiny model's first answers already differ within a group (the toy learning
    # task of ``treadle.trainer.toy``, named from a RolloutJob, whose rewards are DNS labels).
    target = _need_reference(req).strip()
    if len(target) != 1:
        raise errors.SpecError(
            f"letter-fraction needs a one-character reference (the target letter), got {target!r}",
            field="reference",
            value=req.reference,
        )
    value = letter_fraction(req.response, target)
    return value, {"target": target, "chars": len(req.response), "hits": req.response.count(target)}


async def score_code_tests(req: protocol.ScoreRequest, res: Resources) -> Scored:
    tests = _need_reference(req)
    if isinstance(res.sandbox, confine.Unavailable):
        raise errors.Unavailable(f"code-tests needs the sandbox, which cannot run here: {res.sandbox}")
    if res.sandbox is None:
        raise errors.Unavailable("code-tests needs the sandbox, which this gateway was started without")
    judged = await codetests.judge(res.sandbox, req.response, tests, kind="code-tests")
    details = {
        "status": judged.status,
        "passed": judged.passed,
        "stderr_tail": (judged.tests.stderr or judged.code.stderr)[-500:],
        "wall_s": max(judged.code.wall_s, judged.tests.wall_s),
    }
    return (1.0 if judged.passed else 0.0), details


JUDGE_PROMPT = (
    "You are grading an answer. Question:\n{prompt}\n\nReference answer:\n{reference}\n\nCandidate answer:\n"
    "{response}\n\nReply with a single integer score from 0 (wrong) to 10 (fully correct)."
)
SCORE = re.compile(r"\b(10|[0-9])\b")


async def score_llm_judge(req: protocol.ScoreRequest, res: Resources) -> Scored:
    if res.judge is None:
        raise errors.Unavailable("llm-judge needs spec.reward.url, which this gateway's job does not give")
    return await _judge(res.judge, res.judge_model, req)


async def score_reward_model(req: protocol.ScoreRequest, res: Resources) -> Scored:
    """``judge:<name>``: graded by the reward model on a chunk of the gateway's GPUs."""
    if res.reward_models is None:
        raise errors.SpecError(
            f"{req.reward_fn!r} needs spec.externalResources.rewardModels, which this gateway's job "
            "does not give",
            field="reward_fn",
        )
    name = req.reward_fn.removeprefix(v1alpha1.JUDGE)
    async with res.reward_models.lease(name) as lease:
        reward, details = await _judge(lease.client, lease.served, req)
    return reward, details | {"gpus": lease.degree, "restore_s": round(lease.restore_s, 6),
                              "queued_s": round(lease.queued_s, 6)}  # fmt: skip


async def _judge(client: httpx.AsyncClient, judge_model: str | None, req: protocol.ScoreRequest) -> Scored:
    """A 0-10 grade by an OpenAI-compatible judge, scaled to [0, 1]; an unparsable verdict scores 0."""
    content = JUDGE_PROMPT.format(
        prompt=req.prompt or "", reference=req.reference or "", response=req.response
    )
    body: dict[str, Any] = {
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 16,
        "temperature": 0.0,
    }
    if judge_model:
        body["model"] = judge_model
    try:
        response = await client.post("/v1/chat/completions", json=body)
    except httpx.HTTPError as exc:
        raise errors.Unavailable(f"judge unreachable: {type(exc).__name__}: {exc}") from exc
    if response.status_code != 200:
        raise errors.Unavailable(f"judge answered HTTP {response.status_code}: {response.text[:200]}")
    verdict = str(response.json()["choices"][0]["message"].get("content") or "")
    found = SCORE.search(verdict)
    if found is None:
        return 0.0, {"verdict": verdict[:200], "parsed": False}
    return int(found.group(1)) / 10.0, {"verdict": verdict[:200], "parsed": True}


async def score_env(req: protocol.ScoreRequest, res: Resources) -> Scored:
    value = req.metadata.get("env_reward")
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise errors.SpecError("the `env` reward needs a finite number here", field="metadata.env_reward")
    return float(value), {"source": "env"}


async def score_external(req: protocol.ScoreRequest, res: Resources) -> Scored:
    """POST the request to the external service; it answers ``{"reward": number, "details": {...}}``.

    Its 4xx answers are the caller's bad input (not retried); anything else that is not a valid
    score is ``Unavailable``, which the scheduler retries with backoff.
    """
    if res.external is None:
        raise errors.Unavailable("this gateway was started without an external reward url")
    try:
        response = await res.external.client.post(res.external.url, json=req.model_dump())
    except httpx.HTTPError as exc:
        raise errors.Unavailable(f"external reward unreachable: {type(exc).__name__}: {exc}") from exc
    if 400 <= response.status_code < 500:
        raise errors.SpecError(
            f"the external reward service refused the request: HTTP {response.status_code}: "
            f"{response.text[:200]}",
            field="reward_fn",
        )
    if response.status_code != 200:
        raise errors.Unavailable(
            f"external reward answered HTTP {response.status_code}: {response.text[:200]}"
        )
    try:
        body = response.json()
    except ValueError:
        body = None
    reward = body.get("reward") if isinstance(body, dict) else None
    details = body.get("details", {}) if isinstance(body, dict) else None
    if isinstance(reward, bool) or not isinstance(reward, int | float) or not math.isfinite(reward):
        raise errors.Unavailable(
            f"external reward answered without a finite number in `reward`: {response.text[:200]}"
        )
    if not isinstance(details, dict):
        raise errors.Unavailable(f"external reward answered a non-object `details`: {response.text[:200]}")
    return float(reward), {**details, "source": "external"}


BUILTIN: dict[str, tuple[Fn, str]] = {
    "math": (score_math, "math answer: <answer>/\\boxed/last number vs reference, exact or numeric"),
    "exact": (score_exact, "normalized string equality with the reference"),
    "code-tests": (score_code_tests, "response code + reference tests, run in the sandbox"),
    "llm-judge": (score_llm_judge, "an OpenAI-compatible judge model grades 0-10, scaled to [0, 1]"),
    "env": (score_env, "the environment's own reward, passed as metadata.env_reward"),
    "letter-fraction": (
        score_letter_fraction,
        "fraction of the response's characters equal to the reference (one letter)",
    ),
}


def resolve(name: str, res: Resources) -> Fn:
    """The function for ``name``: a built-in, or ``py:module:function`` under an allowed prefix.

    With an external service configured, every name is the external service's to judge.
    """
    if res.external is not None:
        return score_external
    if name in BUILTIN:
        return BUILTIN[name][0]
    if name.startswith(v1alpha1.JUDGE):
        return score_reward_model
    if not name.startswith(plugin.PREFIX):
        raise errors.SpecError(f"unknown reward function {name!r}; known: {sorted(BUILTIN)} or py:MODULE:FN",
                               field="reward_fn")  # fmt: skip
    user = plugin.load(name, res.user_prefixes, what="user function", field="reward_fn")
    return _wrap_user(user, name)


def _wrap_user(user: Callable[..., Any], name: str) -> Fn:
    async def call(req: protocol.ScoreRequest, res: Resources) -> Scored:
        out = user(response=req.response, reference=req.reference, prompt=req.prompt, metadata=req.metadata)
        if inspect.isawaitable(out):
            out = await out
        reward, details = out if isinstance(out, tuple) else (out, {})
        if isinstance(reward, bool) or not isinstance(reward, int | float) or not math.isfinite(reward):
            raise TypeError(f"{name} returned {reward!r}, not a finite number")
        return float(reward), dict(details)

    return call
