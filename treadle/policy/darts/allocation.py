"""DARTS Alg. 1: the per-prompt pool sizes ``M'_i`` that split a total budget (§4.2.2, App. C, Eq. 5/10).

Called by the simulator (``treadle.sim.darts``) once per step and by the live scheduler once it
lands. The objective (Eq. 5/10, as quoted by the digest's secondary source) is::

    minimise  sum_i w_i / M'_i   s.t.  sum_i M'_i = total,  low <= M'_i <= high,  M'_i integer

with ``w_i = Norm(sigma_i)``: the prompt's smoothed response-length std, min-max normalised over the
batch (``normalise``; the paper's ``Norm(sigma~)``: std, not variance, following the quoted LaTeX).
The objective is separable and convex (``d^2/dM^2 w/M = 2w/M^3 >= 0``), so greedy marginal
allocation is optimal: start every prompt at ``low`` and give each further candidate to the prompt
whose objective falls most, ``w_i (1/M'_i - 1/(M'_i + 1)) = w_i / (M'_i (M'_i + 1))``, ties to the
lowest prompt index (Alg. 1 with a deterministic tie-break).

``allocate`` computes exactly that greedy sequence without running it step by step: the marginals of
one prompt fall as its pool grows, so the greedy takes the ``total - N·low`` largest marginals of the
whole ``(prompt, level)`` table in the order (marginal descending, prompt, level). It finds the value
of the last one taken, gives every prompt its marginals above that value, then hands the ties out in
(prompt, level) order, as the greedy would. Cost: one partition of ``N·(high - low)`` floats
(numpy); ``bench/policy_darts.py`` measures it for 512 prompts against the heap loop.

Min-max normalisation gives the lowest-variance prompt of the batch weight 0: it never gets an extra
candidate while another prompt can take one (the paper's rule, kept). A batch whose prompts all
look alike gets weight 1 everywhere, so the budget spreads evenly: the uniform case.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from treadle import errors


def normalise(sigmas: Sequence[float]) -> list[float]:
    """Min-max normalisation over the batch; all equal (or one prompt) -> all 1 (uniform)."""
    for s in sigmas:
        if not math.isfinite(s) or s < 0:
            raise errors.SpecError("must be finite and >= 0", field="sigmas", value=s)
    if not sigmas:
        return []
    lo, hi = min(sigmas), max(sigmas)
    if hi == lo:
        return [1.0] * len(sigmas)
    return [(s - lo) / (hi - lo) for s in sigmas]


def objective(weights: Sequence[float], pools: Sequence[int]) -> float:
    """Eq. 5/10: ``sum_i w_i / M'_i`` (the remaining 'lack of shaping'; lower is better)."""
    return sum(w / p for w, p in zip(weights, pools, strict=True))


def allocate(weights: Sequence[float], total: int, low: int, high: int) -> list[int]:
    """Alg. 1: pool size per prompt, ``low <= M'_i <= high`` summing to ``total``; see the module doc."""
    if low < 1:
        raise errors.SpecError("must be >= 1", field="low", value=low)
    if high < low:
        raise errors.SpecError(f"must be >= low = {low}", field="high", value=high)
    for w in weights:
        if not math.isfinite(w) or w < 0:
            raise errors.SpecError("must be finite and >= 0", field="weights", value=w)
    n = len(weights)
    if not n * low <= total <= n * high:
        raise errors.SpecError(
            f"must be in [N·low, N·high] = [{n * low}, {n * high}]", field="total", value=total
        )
    extra, levels = total - n * low, high - low
    if extra == 0 or extra == n * levels:
        return [low + (levels if extra else 0)] * n
    divisors = np.arange(low, high, dtype=np.float64)
    divisors *= divisors + 1.0  # marginal of the (m+1)-th candidate: w / (m (m + 1))
    vector = np.asarray(weights, dtype=np.float64)
    marginals = vector[:, None] / divisors[None, :]  # [prompt, level], falling along each row
    cut = -np.partition(-marginals.ravel(), extra - 1)[extra - 1]  # the last marginal taken
    above = marginals > cut
    taken = above.sum(axis=1)
    left = extra - int(taken.sum())
    if left and cut > 0:  # ties at the cut, one per prompt at most (w > 0 falls strictly): lowest first
        nxt = np.where(taken < levels, marginals[np.arange(n), np.minimum(taken, levels - 1)], -1.0)
        taken[np.flatnonzero(nxt == cut)[:left]] += 1
    elif left:  # cut 0: weight-0 prompts take whole rows of zero marginals, lowest prompt first
        room = np.where(vector == 0, levels - taken, 0)
        taken += np.clip(left - (np.cumsum(room) - room), 0, room)
    return [low + int(k) for k in taken]
