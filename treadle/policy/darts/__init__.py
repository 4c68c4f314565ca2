"""DARTS (arXiv 2605.30859): adaptive redundant rollout, dual-end selection, tail pruning.

Pure policy code, called by the simulator (``treadle.sim.darts``) and, once the live part lands,
by the scheduler and buffer. One step (digest §2.9)::

    S_t            = stats.dispersion(state)                       dataset sigma / mu over a window
    alpha, _       = budget.marginal_cost(state.recent, ptl, ...)   Eq. 4 on a PTL fitted from samples
    total          = budget.total_budget(S_t, alpha, lambda, ...)   Eqs. 6-9, RECONSTRUCTED
    pools          = allocate(normalise(stats.sigmas(state, ids)), total, M, M_up)   Alg. 1
    group_i        = selection.select(lengths_i, truncated_i, M, K, m_up=M_up)       Alg. 2
    state          = stats.update(state, observations)

* ``stats``: per-prompt EMA of length variance, dataset window, cold start, censored lengths;
* ``budget``: the fitted PTL curve, Eq. 4, and the total budget (Eqs. 6-9, reconstructed);
* ``allocation``: Alg. 1 (``allocate``);
* ``selection``: dual-end and shortest-only selection, early stop, advantages over the selection.

See docs/DARTS.md for what was decided where the paper is silent.
"""

from treadle.policy.darts.allocation import allocate, normalise
from treadle.policy.darts.selection import select_dual_end

__all__ = ["allocate", "normalise", "select_dual_end"]
