"""DARTS length statistics: per-prompt smoothed variance and the dataset-level dispersion ``S_t``.

Called once per step, after the step's pools are in, by the simulator (``treadle.sim.darts``) and by
the live scheduler once it lands (which persists the ``Stats`` value; it is plain data). State in,
next state out: ``update(stats, observations)`` returns a new frozen ``Stats``.

* **Per prompt** (App. C): ``var <- decay·var + (1 - decay)·v_t``, with ``v_t`` the population
  variance of the lengths this prompt's pool produced this step. The first observation of a prompt
  sets ``var = v_t``. A prompt is seen about once per epoch, so the decay weighs epochs, not steps.
  The paper gives no coefficient; ``DEFAULT_DECAY = 0.5`` is ours (recent epochs matter most because
  the policy moves; the history still damps one unlucky pool).
* **Censored lengths** (the paper is silent): a candidate aborted by early stop has a length that
  is only a lower bound: its tokens at the abort. Such a candidate is counted at that lower bound,
  not left out. Early stop aborts precisely a saturated prompt's longest candidates, so leaving them
  out would keep only its ``M`` shortest, make its variance look small, drop it out of saturation
  next epoch and let its tail return (an oscillation); the lower bound still understates the spread,
  but errs toward keeping the pruning. A truncated candidate counts at its length (the limit).
* **Cold start** (the paper is silent): a prompt never seen gets the mean ``sigma`` of the prompts
  seen so far (a "typical" prompt, neither favoured nor starved); before any prompt was seen, all
  prompts look alike, so ``allocation.normalise`` gives every one weight 1 and the budget spreads
  evenly. The dataset dispersion is 0 before the first step, so the first step's budget is ``N·M``:
  standard sampling until there is evidence of length spread.
* **Dataset level** (§4.2.2): mean ``mu`` and std ``sigma`` of every length observed in the last
  ``window`` steps (a moving window; the paper gives no length, ``DEFAULT_WINDOW`` is ours), and
  ``S_t = sigma / mu`` (the coefficient of variation; reconstructed, see ``budget``).
* ``recent``: the last step's lengths (at most ``RECENT_CAP``, every k-th of the sorted list), the
  sample ``budget.marginal_cost`` prices candidates on.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from types import MappingProxyType

from treadle import errors

DEFAULT_DECAY = 0.5
"""EMA coefficient of the per-prompt variance (ours; the paper's is lost)."""
DEFAULT_WINDOW = 8
"""Steps in the dataset-level moving window (ours; the paper's is not given)."""
RECENT_CAP = 4096
"""Lengths kept for pricing candidates (``budget.marginal_cost``)."""


@dataclasses.dataclass(frozen=True)
class Observation:
    """What one prompt's pool produced this step."""

    lengths: tuple[int, ...]
    """Lengths of the candidates that finished (including truncated ones, at the limit)."""
    censored: tuple[int, ...] = ()
    """Lower bounds (tokens at the abort) of the candidates early stop aborted."""

    @property
    def all(self) -> tuple[int, ...]:
        return self.lengths + self.censored


@dataclasses.dataclass(frozen=True)
class Stats:
    """Per-prompt smoothed variances and the dataset window; empty at cold start."""

    decay: float = DEFAULT_DECAY
    window: int = DEFAULT_WINDOW
    variances: Mapping[str, float] = dataclasses.field(default_factory=lambda: MappingProxyType({}))
    """Prompt id -> EMA of its response-length variance (tokens²)."""
    steps: tuple[tuple[int, float, float], ...] = ()
    """Per step in the window, oldest first: (count, sum, sum of squares) of its lengths."""
    recent: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not 0.0 <= self.decay < 1.0:
            raise errors.SpecError("must be in [0, 1)", field="decay", value=self.decay)
        if self.window < 1:
            raise errors.SpecError("must be >= 1", field="window", value=self.window)


def _variance(xs: Sequence[int]) -> float:
    mean = sum(xs) / len(xs)
    return sum((x - mean) ** 2 for x in xs) / len(xs)


def update(stats: Stats, observations: Mapping[str, Observation]) -> Stats:
    """``stats`` after one step's pools (prompt id -> what its pool produced); see the module doc."""
    variances = dict(stats.variances)
    lengths: list[int] = []
    for prompt, obs in observations.items():
        xs = obs.all
        if any(x < 0 for x in xs):
            raise errors.SpecError("lengths must be >= 0", field=f"observations.{prompt}", value=xs)
        lengths += xs
        if len(xs) < 2:  # one length says nothing about spread
            continue
        v = _variance(xs)
        old = variances.get(prompt)
        variances[prompt] = v if old is None else stats.decay * old + (1.0 - stats.decay) * v
    step = (len(lengths), float(sum(lengths)), float(sum(x * x for x in lengths)))
    steps = (*stats.steps, step)[-stats.window :] if lengths else stats.steps
    lengths.sort()
    stride = max(1, math.ceil(len(lengths) / RECENT_CAP))
    recent = tuple(lengths[::stride]) if lengths else stats.recent
    return dataclasses.replace(stats, variances=MappingProxyType(variances), steps=steps, recent=recent)


def sigmas(stats: Stats, prompts: Sequence[str]) -> list[float]:
    """Smoothed length std of each prompt, unseen ones at the mean of the seen (0 when none was seen)."""
    known = [math.sqrt(v) for v in stats.variances.values()]
    cold = sum(known) / len(known) if known else 0.0
    return [math.sqrt(stats.variances[p]) if p in stats.variances else cold for p in prompts]


def dataset(stats: Stats) -> tuple[float, float]:
    """(mean, std) of every length in the window; (0, 0) before the first step."""
    count = sum(c for c, _, _ in stats.steps)
    if count == 0:
        return 0.0, 0.0
    total, squares = sum(s for _, s, _ in stats.steps), sum(q for _, _, q in stats.steps)
    mean = total / count
    return mean, math.sqrt(max(0.0, squares / count - mean * mean))


def dispersion(stats: Stats) -> float:
    """``S_t = sigma / mu`` over the window (0 before the first step or when every length is 0)."""
    mean, std = dataset(stats)
    return std / mean if mean > 0 else 0.0


def to_json(stats: Stats) -> str:
    """``stats`` as JSON (the scheduler keeps it durable; ``from_json`` reads it back unchanged)."""
    return json.dumps(
        {
            "decay": stats.decay, "window": stats.window, "variances": dict(stats.variances),
            "steps": [list(s) for s in stats.steps], "recent": list(stats.recent),
        }
    )  # fmt: skip


def from_json(text: str) -> Stats:
    """The ``Stats`` that ``to_json`` wrote; ``SpecError`` naming the field when it is not one."""
    try:
        raw = json.loads(text)
        return Stats(
            decay=float(raw["decay"]), window=int(raw["window"]),
            variances=MappingProxyType({str(k): float(v) for k, v in raw["variances"].items()}),
            steps=tuple((int(c), float(s), float(q)) for c, s, q in raw["steps"]),
            recent=tuple(int(x) for x in raw["recent"]),
        )  # fmt: skip
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise errors.SpecError(f"not DARTS statistics: {exc!r}", field="stats") from exc
