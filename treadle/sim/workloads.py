"""Workloads: seeded generators of trajectories (turns, tokens, tool and reset latencies).

Called by ``treadle.sim.scenario`` (which reads a task's workload from a scenario file) and by
``treadle.sim.engine`` (which draws one ``TrajectoryShape`` per admitted trajectory). Every
distribution carries its ``source`` (a paper table, or "ours"), and each run owns its
``random.Random``: nothing touches the global RNG.

Long tails: lengths and turns are lognormal with a coefficient of variation (``cv``) and a cap,
which gives the max/mean of 5-9x RollArt reports in production (§8) when cv is about 1-1.5.
Environment resets are a lognormal body plus a rare failure that adds a heavy tail (RollArt §3:
"hundreds of seconds"; ~1 iteration in 10 hit one before the image cache).
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Mapping
from typing import Any

from treadle import errors

DISTS = ("const", "uniform", "lognormal", "normal", "choice")


@dataclasses.dataclass(frozen=True)
class Dist:
    """One scalar distribution, truncated to ``[low, high]``."""

    kind: str
    mean: float
    cv: float = 0.0
    """Standard deviation over mean (lognormal, normal)."""
    low: float = 0.0
    high: float = math.inf
    source: str = "ours"
    values: tuple[float, ...] = ()
    """``choice``: the values drawn, with ``weights`` (a bimodal mix such as few long, many short)."""
    weights: tuple[float, ...] = ()

    def sample(self, rng: random.Random) -> float:
        if self.kind == "choice":
            x = rng.choices(self.values, self.weights)[0]
        elif self.kind == "const":
            x = self.mean
        elif self.kind == "uniform":
            x = rng.uniform(self.low, self.high)
        elif self.kind == "normal":
            x = rng.gauss(self.mean, self.cv * self.mean)
        else:  # lognormal with the given mean and cv
            sigma2 = math.log1p(self.cv * self.cv)
            x = rng.lognormvariate(math.log(self.mean) - sigma2 / 2, math.sqrt(sigma2))
        return min(self.high, max(self.low, x))


def parse_dist(raw: Any, *, field: str) -> Dist:
    """A ``Dist`` from a scenario mapping; ``SpecError`` names ``field`` on bad input."""
    if isinstance(raw, int | float) and not isinstance(raw, bool):
        return Dist("const", float(raw), low=float(raw), high=float(raw), source="ours")
    if not isinstance(raw, Mapping):
        raise errors.SpecError("must be a number or a mapping with dist/mean/source", field=field, value=raw)
    kind = raw.get("dist", "const")
    if kind not in DISTS:
        raise errors.SpecError(f"must be one of {list(DISTS)}", field=f"{field}.dist", value=kind)
    if "source" not in raw:
        raise errors.SpecError(
            "every parameter names its source (a paper table, or 'ours')", field=f"{field}.source"
        )
    if kind == "choice":
        return parse_choice(raw, field=field)
    try:
        low = float(raw.get("min", 0.0))
        high = float(raw.get("max", math.inf))
        mean = (low + high) / 2 if kind == "uniform" else float(raw["mean"])
        cv = float(raw.get("cv", 0.0))
    except (KeyError, TypeError, ValueError) as exc:
        raise errors.SpecError(f"bad distribution: {exc}", field=field, value=dict(raw)) from None
    if mean < 0 or cv < 0 or low > high or (kind == "lognormal" and mean <= 0):
        raise errors.SpecError("needs mean > 0, cv >= 0 and min <= max", field=field, value=dict(raw))
    if kind == "uniform" and not math.isfinite(high):
        raise errors.SpecError("uniform needs min and max", field=field, value=dict(raw))
    return Dist(kind, mean, cv=cv, low=low, high=high, source=str(raw["source"]))


def parse_choice(raw: Mapping[str, Any], *, field: str) -> Dist:
    """``{dist: choice, values: [32, 2], weights: [1, 60], source: ...}``: each value with its weight."""
    values, weights = raw.get("values"), raw.get("weights")
    if not isinstance(values, list) or not values or not all(_number(v) and v >= 0 for v in values):
        raise errors.SpecError(
            "must be a non-empty list of numbers >= 0", field=f"{field}.values", value=values
        )
    if (
        not isinstance(weights, list)
        or len(weights) != len(values)
        or not all(_number(w) and w > 0 for w in weights)
    ):
        raise errors.SpecError(
            f"must be {len(values)} numbers > 0, one per value", field=f"{field}.weights", value=weights
        )
    mean = sum(v * w for v, w in zip(values, weights, strict=True)) / sum(weights)
    return Dist(
        "choice", mean, low=float(min(values)), high=float(max(values)), source=str(raw["source"]),
        values=tuple(float(v) for v in values), weights=tuple(float(w) for w in weights),
    )  # fmt: skip


def _number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


@dataclasses.dataclass(frozen=True)
class Workload:
    """How one task domain's trajectories look."""

    turns: Dist
    prompt_tokens: Dist
    response_tokens: Dist
    """Per turn."""
    observation_tokens: Dist
    """Per turn after the first (what the environment returns)."""
    tool_latency_s: Dist
    """One environment step."""
    reset_s: Dist
    """``env.reset`` when it does not fail."""
    reset_failure_p: float
    reset_failure_s: Dist
    """Extra time of a failed-then-retried reset."""
    reward_kind: str
    """``rule`` (CPU, milliseconds) or ``llm-judge`` (a GPU prefill over the trajectory)."""
    prefix_reuse: float
    """Share of the history the worker's prefix cache serves on a sticky turn (0: re-prefill all)."""
    max_context: int = 32768


WORKLOAD_FIELDS = (
    "turns",
    "prompt_tokens",
    "response_tokens",
    "observation_tokens",
    "tool_latency_s",
    "reset_s",
    "reset_failure_s",
)


def parse_workload(raw: Mapping[str, Any], *, field: str) -> Workload:
    if not isinstance(raw, Mapping):
        raise errors.SpecError("must be a mapping", field=field, value=raw)
    unknown = set(raw) - {*WORKLOAD_FIELDS, "reset_failure_p", "reward", "prefix_reuse", "max_context"}
    if unknown:
        raise errors.SpecError(f"unknown keys {sorted(unknown)}", field=field)
    dists = {}
    for name in WORKLOAD_FIELDS:
        if name not in raw:
            raise errors.SpecError("is required", field=f"{field}.{name}")
        dists[name] = parse_dist(raw[name], field=f"{field}.{name}")
    p = float(raw.get("reset_failure_p", 0.0))
    if not 0.0 <= p <= 1.0:
        raise errors.SpecError("must be within [0, 1]", field=f"{field}.reset_failure_p", value=p)
    reward = str(raw.get("reward", "rule"))
    if reward not in ("rule", "llm-judge"):
        raise errors.SpecError("must be rule or llm-judge", field=f"{field}.reward", value=reward)
    reuse = float(raw.get("prefix_reuse", 0.0))
    if not 0.0 <= reuse <= 1.0:
        raise errors.SpecError("must be within [0, 1]", field=f"{field}.prefix_reuse", value=reuse)
    return Workload(
        **dists,
        reset_failure_p=p,
        reward_kind=reward,
        prefix_reuse=reuse,
        max_context=int(raw.get("max_context", 32768)),
    )


@dataclasses.dataclass(frozen=True, slots=True)
class TrajectoryShape:
    """One drawn trajectory: per-turn (new input tokens, response tokens, tool latency) and reset."""

    inputs: tuple[int, ...]
    responses: tuple[int, ...]
    tools: tuple[float, ...]
    reset_s: float


def draw(workload: Workload, rng: random.Random) -> TrajectoryShape:
    """One trajectory of ``workload``; the context never exceeds ``max_context`` (the last turn is cut)."""
    turns = max(1, round(workload.turns.sample(rng)))
    inputs: list[int] = []
    responses: list[int] = []
    tools: list[float] = []
    context = 0
    for turn in range(turns):
        new = max(
            1, round((workload.prompt_tokens if turn == 0 else workload.observation_tokens).sample(rng))
        )
        out = max(1, round(workload.response_tokens.sample(rng)))
        room = workload.max_context - context - new
        if room < 1:
            break
        out = min(out, room)
        inputs.append(new)
        responses.append(out)
        tools.append(workload.tool_latency_s.sample(rng))
        context += new + out
    if not inputs:  # a prompt longer than the context: keep one minimal turn so the shape is valid
        inputs, responses, tools = [workload.max_context - 1], [1], [0.0]
    reset = workload.reset_s.sample(rng)
    if workload.reset_failure_p and rng.random() < workload.reset_failure_p:
        reset += workload.reset_failure_s.sample(rng)
    return TrajectoryShape(tuple(inputs), tuple(responses), tuple(tools), reset)


def mean_profile(workload: Workload) -> dict[str, float]:
    """Distribution means, for ``affinity`` profiles and reports."""
    return {
        "mean_turns": workload.turns.mean,
        "prompt_tokens": workload.prompt_tokens.mean,
        "response_tokens": workload.response_tokens.mean,
        "observation_tokens": workload.observation_tokens.mean,
        "prefix_reuse": workload.prefix_reuse,
    }
