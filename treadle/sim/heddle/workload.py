"""Heddle's workloads: agentic domains and the long-tailed trajectory shapes drawn from them.

Called by ``treadle.sim.heddle.step`` (the batch and the predictor's history) and by the ``heddle``
scenario kind (``parse_domain``). A prompt's difficulty scales its steps and tokens and is shared by
its GRPO group (Heddle Fig. 5); everything drawn here is simulated.
"""

from __future__ import annotations

import dataclasses
import math
import random
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from treadle import errors
from treadle.sim import workloads


@dataclasses.dataclass(frozen=True)
class Domain:
    """An agentic workload (coding, search, math): trajectories of steps, tool calls in between."""

    name: str
    steps: workloads.Dist
    prompt_tokens: workloads.Dist
    response_tokens: workloads.Dist
    """Per step, before the trajectory's difficulty scale."""
    observation_tokens: workloads.Dist
    tool_latency_s: workloads.Dist
    difficulty_cv: float
    """Spread of a prompt's difficulty (shared by its GRPO group; Heddle Fig. 5)."""
    sample_cv: float
    """Spread of one sample around its prompt (intra-group variance)."""
    predict_s: float
    """Predictor latency per call (Heddle Table 1); hidden when the tool call is longer."""
    prefix_reuse: float = 0.95
    """Share of the history the worker's radix/prefix cache serves on a sticky step."""
    max_output_tokens: int = 40960
    """Heddle's cap on generated tokens per trajectory (40K)."""
    group_steps: bool = False
    """A prompt's step count is shared by its GRPO group instead of drawn per sample; a ``choice``'s
    values are dealt to the groups in proportion to its weights, in a shuffled order, as
    ``bench/heddle_live.py --mix`` gives exactly COUNT groups of TURNS turns."""


@dataclasses.dataclass(frozen=True)
class Shape:
    """One drawn trajectory."""

    group: int
    inputs: tuple[int, ...]
    responses: tuple[int, ...]
    tools: tuple[float, ...]

    @property
    def output(self) -> int:
        return sum(self.responses)


def draw_batch(domain: Domain, *, prompts: int, group_size: int, rng: random.Random) -> list[Shape]:
    """``prompts`` GRPO groups of ``group_size``; a prompt's difficulty scales steps and tokens."""
    difficulty = workloads.Dist("lognormal", 1.0, cv=domain.difficulty_cv)
    noise = workloads.Dist("lognormal", 1.0, cv=domain.sample_cv)
    scales = [difficulty.sample(rng) for _ in range(prompts)]
    shared = _group_steps(domain, scales, rng) if domain.group_steps else []
    return [
        draw(domain, g, scales[g] * noise.sample(rng), rng, steps=shared[g] if shared else None)
        for g in range(prompts)
        for _ in range(group_size)
    ]


def _steps(domain: Domain, scale: float, rng: random.Random, drawn: float | None = None) -> int:
    value = domain.steps.sample(rng) if drawn is None else drawn
    steps = max(1, round(value * math.sqrt(scale)))
    return min(steps, round(domain.steps.high)) if math.isfinite(domain.steps.high) else steps


def _group_steps(domain: Domain, scales: Sequence[float], rng: random.Random) -> list[int]:
    """Each group's step count (``Domain.group_steps``): a choice dealt by its weights, else drawn."""
    dist = domain.steps
    if dist.kind != "choice":
        return [_steps(domain, scale, rng) for scale in scales]
    share = [w / sum(dist.weights) * len(scales) for w in dist.weights]
    counts = [math.floor(x) for x in share]
    by_remainder = sorted(range(len(share)), key=lambda i: counts[i] - share[i])
    for i in by_remainder[: len(scales) - sum(counts)]:
        counts[i] += 1
    deck = [v for v, n in zip(dist.values, counts, strict=True) for _ in range(n)]
    rng.shuffle(deck)
    return [_steps(domain, scale, rng, drawn=v) for scale, v in zip(scales, deck, strict=True)]


def draw(domain: Domain, group: int, scale: float, rng: random.Random, *, steps: int | None = None) -> Shape:
    """One trajectory; ``steps`` given (the group's, ``Domain.group_steps``) or drawn."""
    steps = _steps(domain, scale, rng) if steps is None else steps
    inputs: list[int] = []
    responses: list[int] = []
    tools: list[float] = []
    left = domain.max_output_tokens
    for s in range(steps):
        if left < 1:
            break
        first = domain.prompt_tokens if s == 0 else domain.observation_tokens
        inputs.append(max(1, round(first.sample(rng))))
        out = min(left, max(1, round(domain.response_tokens.sample(rng) * math.sqrt(scale))))
        responses.append(out)
        tools.append(domain.tool_latency_s.sample(rng))
        left -= out
    return Shape(group=group, inputs=tuple(inputs), responses=tuple(responses), tools=tuple(tools))


def mean_context(domain: Domain) -> float:
    """Mean context of a running sequence (half a mean trajectory's final context): profiles' KV."""
    steps = domain.steps.mean
    per_step = domain.observation_tokens.mean + domain.response_tokens.mean
    return domain.prompt_tokens.mean + per_step * steps / 2


def redraw(domain: Domain, batch: Sequence[Shape], group_size: int, rng: random.Random) -> list[Shape]:
    """New samples of the same prompts: each group's scale is re-estimated from its members' output."""
    by_group: dict[int, list[Shape]] = {}
    for s in batch:
        by_group.setdefault(s.group, []).append(s)
    noise = workloads.Dist("lognormal", 1.0, cv=domain.sample_cv)
    base = _typical_output(domain)
    out = []
    for g, members in sorted(by_group.items()):
        scale = statistics.fmean(m.output for m in members) / base
        steps = len(members[0].responses) if domain.group_steps else None
        out += [draw(domain, g, scale * noise.sample(rng), rng, steps=steps) for _ in range(group_size)]
    return out


def _typical_output(domain: Domain) -> float:
    return domain.steps.mean * domain.response_tokens.mean


def parse_domain(raw: Mapping[str, Any], *, name: str, field: str) -> Domain:
    """A ``Domain`` from a scenario mapping; ``SpecError`` names the field."""
    dists = {}
    for key in ("steps", "prompt_tokens", "response_tokens", "observation_tokens", "tool_latency_s"):
        if key not in raw:
            raise errors.SpecError("is required", field=f"{field}.{key}")
        dists[key] = workloads.parse_dist(raw[key], field=f"{field}.{key}")
    group_steps = raw.get("group_steps", False)
    if not isinstance(group_steps, bool):
        raise errors.SpecError(f"must be true or false, got {group_steps!r}", field=f"{field}.group_steps")
    try:
        return Domain(
            name=name,
            **dists,
            difficulty_cv=float(raw["difficulty_cv"]),
            sample_cv=float(raw["sample_cv"]),
            predict_s=float(raw["predict_s"]),
            prefix_reuse=float(raw.get("prefix_reuse", 0.95)),
            max_output_tokens=int(raw.get("max_output_tokens", 40960)),
            group_steps=group_steps,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise errors.SpecError(f"bad domain: {exc}", field=field) from None
