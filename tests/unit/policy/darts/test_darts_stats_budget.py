"""DARTS statistics (EMA, window, cold start, censored lengths) and budget (PTL fit, Eq. 4, Eqs. 6-9)."""

from __future__ import annotations

import math

import pytest

from treadle import errors
from treadle.policy.darts import budget, plan, stats


def test_ema_of_variance_first_observation_then_decay() -> None:
    s = stats.update(stats.Stats(decay=0.5), {"a": stats.Observation((10, 20))})  # var 25
    assert s.variances["a"] == 25.0
    s = stats.update(s, {"a": stats.Observation((10, 10, 10))})  # var 0
    assert s.variances["a"] == 12.5
    s = stats.update(s, {"a": stats.Observation((7,))})  # one length: no spread information
    assert s.variances["a"] == 12.5


def test_censored_lengths_count_at_their_lower_bound() -> None:
    done = stats.update(stats.Stats(), {"a": stats.Observation((10, 10), censored=(30, 30))})
    dropped = stats.update(stats.Stats(), {"a": stats.Observation((10, 10))})
    assert done.variances["a"] == 100.0 and dropped.variances["a"] == 0.0


def test_cold_start_takes_the_mean_sigma_of_seen_prompts() -> None:
    assert stats.sigmas(stats.Stats(), ["x", "y"]) == [0.0, 0.0]
    s = stats.update(stats.Stats(), {"a": stats.Observation((0, 2)), "b": stats.Observation((0, 6))})
    assert stats.sigmas(s, ["a", "b", "new"]) == [1.0, 3.0, 2.0]


def test_dataset_window_and_dispersion() -> None:
    s = stats.Stats(window=2)
    assert stats.dispersion(s) == 0.0
    s = stats.update(s, {"a": stats.Observation((1000, 1000))})
    s = stats.update(s, {"a": stats.Observation((10, 30))})
    assert stats.dataset(s)[0] == 510.0
    s = stats.update(s, {"a": stats.Observation((10, 30))})  # the 1000s leave the window
    assert stats.dataset(s) == (20.0, 10.0) and stats.dispersion(s) == 0.5
    assert s.recent == (10, 30)


def test_stats_refuse_bad_settings() -> None:
    with pytest.raises(errors.SpecError) as info:
        stats.Stats(decay=1.0)
    assert info.value.field == "decay"


def _piecewise(b: float) -> float:
    return 0.010 + 1e-4 * b + 2e-4 * max(0.0, b - 64) + 3e-4 * max(0.0, b - 256)


def test_ptl_fit_recovers_a_three_piece_curve_from_samples() -> None:
    samples = [(b, _piecewise(b)) for b in (1, 2, 4, 8, 16, 32, 64, 128, 256, 384, 512)]
    ptl = budget.fit_ptl(samples)
    assert ptl.breaks == (64.0, 256.0)
    for b in (3, 50, 100, 300, 500):
        assert ptl(b) == pytest.approx(_piecewise(b), rel=1e-6)
    with pytest.raises(errors.SpecError) as info:
        budget.fit_ptl(samples[:3])
    assert info.value.field == "samples"


def test_eq4_decodes_each_interval_at_the_live_batch() -> None:
    ptl = budget.Ptl(0.0, 1.0, (10.0, 20.0), (0.0, 0.0))  # PTL(b) = b seconds
    # 3 sequences of 1, 2, 4 tokens: 1 token at batch 3, 1 more at batch 2, 2 more at batch 1
    assert budget.rollout_time([4, 1, 2], ptl) == 3 + 2 + 2
    assert budget.rollout_time_dp([[4, 1, 2], [5]], ptl) == 7
    assert budget.rollout_time_dp([], ptl) == 0.0


def test_budget_is_clipped_and_reconstructed_eq8() -> None:
    kw = {"prompts": 10, "m": 8, "m_up": 16}
    assert budget.total_budget(0.6, 1e-3, 5.0, **kw) == 120  # 0.6 / (5 · 1e-3)
    assert budget.total_budget(0.6, 1e-3, 500.0, **kw) == 80  # clipped to N·M
    assert budget.total_budget(0.6, 1e-6, 5.0, **kw) == 160  # clipped to N·M_up
    assert budget.total_budget(0.0, 1e-3, 5.0, **kw) == 80  # no spread seen yet: standard sampling
    assert budget.total_budget(0.6, 0.0, 5.0, **kw) == 160  # free candidates: the cap
    with pytest.raises(errors.SpecError) as info:
        budget.total_budget(0.6, 1e-3, 0.0, **kw)
    assert info.value.field == "lambda"


def test_marginal_cost_falls_with_more_replicas() -> None:
    """Spread over more replicas, extra candidates decode at small batches, where PTL is flat."""
    ptl = budget.fit_ptl([(b, _piecewise(b)) for b in (1, 2, 4, 8, 16, 32, 64, 128, 256, 384, 512)])
    tailed = [500] * 90 + [8000] * 10
    kw = {"prompts": 64, "m": 8, "m_up": 16}
    a_few, t0 = budget.marginal_cost(tailed, ptl, replicas=4, **kw)
    a_many, _ = budget.marginal_cost(tailed, ptl, replicas=16, **kw)
    assert 0 < a_many < a_few and math.isfinite(t0)
    assert budget.marginal_cost([], ptl, replicas=4, **kw) == (0.0, 0.0)


def test_statistics_survive_json_unchanged_and_garbage_names_the_field() -> None:
    s = stats.update(stats.Stats(decay=0.25, window=3), {"a": stats.Observation((1, 9), censored=(20,))})
    assert stats.from_json(stats.to_json(s)) == s
    with pytest.raises(errors.SpecError) as info:
        stats.from_json('{"decay": 0.5}')
    assert info.value.field == "stats"


def test_plan_is_standard_without_a_fitted_latency_or_room_above_m() -> None:
    s = stats.update(stats.Stats(), {"a": stats.Observation((1, 90)), "b": stats.Observation((5, 6))})
    assert plan.pools(s, ["a", "b"], None, m=4, m_up=8, lam=1e-9, replicas=1) == ([4, 4], 8)
    ptl = budget.fit_ptl([(b, 0.01 + 0.001 * b) for b in (1, 2, 4, 8, 16)])
    assert plan.pools(s, ["a", "b"], ptl, m=4, m_up=4, lam=1e-9, replicas=1) == ([4, 4], 8)
    assert plan.pools(s, ["a", "b"], ptl, m=4, m_up=8, lam=1e-9, replicas=1) == ([8, 8], 16)  # at the cap
    # lambda 4.4: M* = S_t / (lambda alpha) = 1.46 / (4.4 * 0.0255) = 13; the wide prompt takes the extra
    assert plan.pools(s, ["a", "b"], ptl, m=4, m_up=8, lam=4.4, replicas=1) == ([8, 5], 13)
    assert plan.pools(s, ["a", "b"], ptl, m=4, m_up=8, lam=4.4, replicas=1, adaptive=False) == ([7, 6], 13)
