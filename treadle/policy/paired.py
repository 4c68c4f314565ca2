"""How much faster one configuration is than another, with a 95 % interval, from paired rounds.

Called by the live Heddle benches (``bench/heddle_live.py``, ``bench/heddle_vllm.py``), which run
every configuration once per round, back to back, so a round's configurations share the machine's
load at that moment. The ratio of a round is ``baseline_s / candidate_s`` (above 1: the candidate
is faster); the interval is Student's t on the rounds' log ratios, exponentiated, so it is
multiplicative and a round at half the speed weighs as much as one at twice. Pairing removes the
load drift between rounds (what a single mean over rounds cannot), but not the load changing
within a round, so the benches alternate the order per round.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence

from treadle.errors import SpecError

_SIMPSON_PANELS = 2000
"""Even panels of the t density's integral; the CDF is then exact to ~1e-9 for |t| <= 15."""


@dataclasses.dataclass(frozen=True)
class RatioInterval:
    ratio: float
    """Geometric mean over the rounds of ``baseline / candidate``."""
    low: float
    high: float
    rounds: int

    def excludes_one(self) -> bool:
        """The interval lies wholly above or wholly below 1: a difference at this confidence."""
        return self.low > 1.0 or self.high < 1.0

    def __str__(self) -> str:
        if self.rounds < 2:
            return f"{self.ratio:.2f}x (1 round, no interval)"
        return f"{self.ratio:.2f}x [95 % {self.low:.2f}-{self.high:.2f}, {self.rounds} rounds]"


def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (bisection on its CDF)."""
    if not 0.5 <= p < 1.0:
        raise SpecError("must be in [0.5, 1)", field="p", value=p)
    if df < 1:
        raise SpecError("must be at least 1", field="df", value=df)
    lo, hi = 0.0, 1.0
    while _t_cdf(hi, df) < p:
        hi *= 2.0
    for _ in range(60):
        mid = (lo + hi) / 2.0
        lo, hi = (mid, hi) if _t_cdf(mid, df) < p else (lo, mid)
    return (lo + hi) / 2.0


def _t_cdf(x: float, df: int) -> float:
    """P(T <= x) for x >= 0: 1/2 plus Simpson's rule over the density on [0, x]."""
    log_norm = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)

    def density(t: float) -> float:
        return math.exp(log_norm - (df + 1) / 2 * math.log1p(t * t / df))

    h = x / _SIMPSON_PANELS
    odd = sum(density((2 * k - 1) * h) for k in range(1, _SIMPSON_PANELS // 2 + 1))
    even = sum(density(2 * k * h) for k in range(1, _SIMPSON_PANELS // 2))
    return 0.5 + h / 3 * (density(0.0) + 4 * odd + 2 * even + density(x))


def ratio_interval(
    baseline_s: Sequence[float], candidate_s: Sequence[float], *, confidence: float = 0.95
) -> RatioInterval:
    """Paired ``baseline / candidate`` over rounds (same index = same round) with a t interval."""
    if len(baseline_s) != len(candidate_s):
        raise SpecError(
            f"{len(baseline_s)} baseline rounds against {len(candidate_s)}", field="candidate_s",
            value=len(candidate_s),
        )  # fmt: skip
    if not baseline_s:
        raise SpecError("needs at least one round", field="baseline_s", value=0)
    if not all(x > 0 and math.isfinite(x) for x in (*baseline_s, *candidate_s)):
        raise SpecError("step times must be positive and finite", field="baseline_s", value=None)
    if not 0 < confidence < 1:
        raise SpecError("must be in (0, 1)", field="confidence", value=confidence)
    logs = [math.log(b / c) for b, c in zip(baseline_s, candidate_s, strict=True)]
    mean = statistics.fmean(logs)
    if len(logs) < 2:
        return RatioInterval(math.exp(mean), math.nan, math.nan, 1)
    half = t_quantile(0.5 + confidence / 2, len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    return RatioInterval(math.exp(mean), math.exp(mean - half), math.exp(mean + half), len(logs))
