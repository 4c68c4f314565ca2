"""One DARTS step's plan: the total budget and each prompt's pool size (digest §2.9, first three lines).

Called once per step by the simulator (``treadle.sim.darts``) and by the live scheduler
(``treadle.services.scheduler.darts``), so both size their pools by the same code::

    S_t    = stats.dispersion(state)                              dataset sigma / mu over a window
    alpha  = budget.marginal_cost(state.recent, ptl, ...)          Eq. 4 on the fitted PTL
    total  = budget.total_budget(S_t, alpha, lambda, ...)          Eqs. 6-9, RECONSTRUCTED
    pools  = allocate(normalise(stats.sigmas(state, prompts)), total, M, M_up)   Alg. 1

Without a fitted per-token latency (``ptl`` is ``None``: too few engine measurements yet) extra
candidates have no measured price, so the step is standard sampling (every pool ``M``): the
conservative choice, as the cold start of ``stats`` is. So is ``M_up == M`` (no room to allocate).
"""

from __future__ import annotations

from collections.abc import Sequence

from treadle.policy import darts
from treadle.policy.darts import budget, stats


def pools(
    state: stats.Stats,
    prompts: Sequence[str],
    ptl: budget.Ptl | None,
    *,
    m: int,
    m_up: int,
    lam: float,
    replicas: int,
    adaptive: bool = True,
) -> tuple[list[int], int]:
    """(pool size per prompt, total budget); ``adaptive=False`` spreads the budget evenly (the
    uniform-redundancy ablation of Table 3)."""
    n = len(prompts)
    if ptl is None or m_up <= m:
        return [m] * n, n * m
    alpha, _ = budget.marginal_cost(state.recent, ptl, prompts=n, m=m, m_up=m_up, replicas=replicas)
    total = budget.total_budget(stats.dispersion(state), alpha, lam, prompts=n, m=m, m_up=m_up)
    sigmas = stats.sigmas(state, prompts) if adaptive else [1.0] * n
    return darts.allocate(darts.normalise(sigmas), total, m, m_up), total
