"""DARTS rollout cost (Eq. 4, App. A) and total redundancy budget (Eqs. 6-9, RECONSTRUCTED).

Called once per step by the simulator (``treadle.sim.darts``) and by the live scheduler once it
lands; ``fit_ptl`` once per (model, TP, GPU) from measured samples.

* **Per-token latency** ``PTL(b)`` (App. A): a three-piece linear function of the running batch
  size, *fitted* from ``(batch size, seconds per decode step)`` samples measured on the engine
  (``fit_ptl``): continuous, ``y = a + b·x + c·max(0, x - k1) + d·max(0, x - k2)``, least squares
  for every pair of breakpoints ``k1 < k2`` among the measured batch sizes, the pair with the least
  squared error kept. Continuity is ours (the paper's fitted coefficients are lost): a decode step
  cannot get faster or jump when one sequence joins.
* **Eq. 4** (``rollout_time``): ``T = sum_m (l_[m] - l_[m-1]) · PTL(n - m + 1)`` over the sorted
  lengths of the ``n`` sequences of one replica, each interval decoded at the batch still alive;
  data parallel takes the slowest replica (``rollout_time_dp``).
* **Eqs. 6-9 are RECONSTRUCTED** (the equation bodies are lost from the paper text; the digest
  rebuilt them from the prose, §2.5): ``T(M) = alpha·M + T0`` (Eq. 6, rollout time linear in the
  total budget ``M``), ``E(M) = S_t·log M`` (Eq. 7, diminishing returns amplified by the dataset
  dispersion ``S_t = sigma/mu``), ``U = E - lambda·T`` maximised at ``M* = S_t / (lambda·alpha)``
  (Eq. 8) and ``M_total = clip(M*, N·M, N·M_up)`` (Eq. 9). Only the functional form is certain.
* ``alpha`` (ours, digest §2.5): Eq. 4 evaluated at the two ends of the budget range, spread over
  the replicas, and the finite difference per candidate. The lengths are the ``N·M / replicas``
  evenly spaced quantiles of the last step's lengths (no RNG); the larger budget repeats each of
  them evenly, so ``alpha`` prices what extra candidates cost through the batch size (PTL) and not
  the further tail a bigger sample would reach: drawing more quantiles made ``alpha`` swing 5x from
  step to step on the one or two extreme lengths it happened to include (simulated, 14B on H20).
  It is re-estimated every step because lengths drift as the policy learns. ``lambda`` is in
  utility per second: larger is more conservative.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence

from treadle import errors

MIN_PTL_S = 1e-9
"""Floor of a fitted per-token latency (a fit may dip below 0 outside the measured range)."""


@dataclasses.dataclass(frozen=True)
class Ptl:
    """A continuous three-piece linear per-token latency (seconds) in the running batch size."""

    intercept: float
    slope: float
    breaks: tuple[float, float]
    """Batch sizes ``k1 < k2`` where the slope changes."""
    bends: tuple[float, float]
    """Slope added after each break."""

    def __call__(self, batch: float) -> float:
        (k1, k2), (c, d) = self.breaks, self.bends
        y = self.intercept + self.slope * batch + c * max(0.0, batch - k1) + d * max(0.0, batch - k2)
        return max(MIN_PTL_S, y)


def _solve(a: list[list[float]], b: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting; ``None`` when singular."""
    n = len(b)
    m = [[*row, v] for row, v in zip(a, b, strict=True)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[pivot][col]) < 1e-12:
            return None
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(n):
            if r != col:
                f = m[r][col] / m[col][col]
                m[r] = [x - f * y for x, y in zip(m[r], m[col], strict=True)]
    return [m[i][n] / m[i][i] for i in range(n)]


def fit_ptl(samples: Sequence[tuple[float, float]]) -> Ptl:
    """The least-squares continuous 3-piece linear fit of ``(batch size, seconds)`` samples."""
    xs = sorted({float(x) for x, _ in samples})
    if len(xs) < 4:
        raise errors.SpecError("need samples at >= 4 distinct batch sizes", field="samples", value=len(xs))
    for x, y in samples:
        if not (math.isfinite(x) and math.isfinite(y)) or x <= 0 or y <= 0:
            raise errors.SpecError("batch sizes and latencies must be > 0", field="samples", value=(x, y))
    best: tuple[float, Ptl] | None = None
    for k1, k2 in itertools.combinations(xs[1:-1], 2):
        rows = [[1.0, x, max(0.0, x - k1), max(0.0, x - k2)] for x, _ in samples]
        ata = [[sum(r[i] * r[j] for r in rows) for j in range(4)] for i in range(4)]
        aty = [sum(r[i] * y for r, (_, y) in zip(rows, samples, strict=True)) for i in range(4)]
        coef = _solve(ata, aty)
        if coef is None:
            continue
        ptl = Ptl(coef[0], coef[1], (k1, k2), (coef[2], coef[3]))
        sse = sum((ptl(x) - y) ** 2 for x, y in samples)
        if best is None or sse < best[0]:
            best = (sse, ptl)
    if best is None:  # only when every breakpoint pair left the system singular
        raise errors.SpecError("samples do not determine a 3-piece fit", field="samples")
    return best[1]


def rollout_time(lengths: Sequence[float], ptl: Ptl) -> float:
    """Eq. 4: seconds to decode ``lengths`` together on one replica, each interval at the live batch."""
    total, previous, n = 0.0, 0.0, len(lengths)
    for m, length in enumerate(sorted(lengths)):
        total += (length - previous) * ptl(n - m)
        previous = length
    return total


def rollout_time_dp(replicas: Sequence[Sequence[float]], ptl: Ptl) -> float:
    """Data parallel: the slowest replica's Eq. 4 time (0 with no replica)."""
    return max((rollout_time(r, ptl) for r in replicas), default=0.0)


def _quantiles(sample: Sequence[int], n: int) -> list[float]:
    """``n`` evenly spaced quantiles of the sorted ``sample`` (deterministic draws)."""
    s = len(sample)
    return [float(sample[min(s - 1, int((k + 0.5) * s / n))]) for k in range(n)]


def marginal_cost(
    recent: Sequence[int], ptl: Ptl, *, prompts: int, m: int, m_up: int, replicas: int
) -> tuple[float, float]:
    """(alpha, T0) of Eq. 6: seconds per extra candidate in the total budget, and the constant."""
    if replicas < 1:
        raise errors.SpecError("must be >= 1", field="replicas", value=replicas)
    if not 1 <= m < m_up:
        raise errors.SpecError(f"need 1 <= m < m_up, got m = {m}", field="m_up", value=m_up)
    if not recent or prompts < 1:
        return 0.0, 0.0

    lo, hi = prompts * m, prompts * m_up
    base = _quantiles(recent, math.ceil(lo / replicas))

    def t(total: int) -> float:
        per_replica = math.ceil(total / replicas)  # the base lengths, each repeated evenly
        return rollout_time([base[i * len(base) // per_replica] for i in range(per_replica)], ptl)

    alpha = (t(hi) - t(lo)) / (hi - lo)
    return alpha, t(lo) - alpha * lo


def total_budget(dispersion: float, alpha: float, lam: float, *, prompts: int, m: int, m_up: int) -> int:
    """Eqs. 8-9 (RECONSTRUCTED): ``clip(round(S_t / (lambda·alpha)), N·M, N·M_up)``."""
    if lam <= 0 or not math.isfinite(lam):
        raise errors.SpecError("must be finite and > 0", field="lambda", value=lam)
    lo, hi = prompts * m, prompts * m_up
    if dispersion <= 0:
        return lo
    if alpha <= 0:  # extra candidates cost nothing measurable: take the cap
        return hi
    best = dispersion / (lam * alpha)
    return int(min(hi, max(lo, round(best))))
