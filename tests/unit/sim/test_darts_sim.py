"""The DARTS simulator (``treadle.sim.darts``): it runs the very ``treadle.policy.darts`` functions,
its early stop ends a saturated prompt at its M-th valid completion, and each system does what it says."""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable
from typing import Any

import pytest

from treadle.policy import costmodel, darts
from treadle.policy.darts import allocation, budget, selection, stats
from treadle.sim import darts as sim

WORKLOAD = sim.Workload(
    median_tokens=800,
    inter_sigma=0.5,
    intra_sigma=0.8,
    pattern_i=0.6,
    difficulty=1.0,
    slope=1.0,
    prompt_tokens=100,
)
CFG = sim.Config(
    model=costmodel.QWEN25_3B, accelerator=costmodel.H20, gpus=8, tp=1, rollout_share=0.5, prompts=64,
    batch=16, group=8, m_up=16, long_end=1, lam=0.01, ema_decay=0.5, max_tokens=8192, context=2048,
    chunk=256, train_mfu=0.5, sync_s=1.0, oversample=0.25, lr_mu=0.3, lr_sigma=0.3, workload=WORKLOAD,
    steps=6, seed=3,
)  # fmt: skip


def test_the_simulator_calls_the_policy_functions(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: collections.Counter[str] = collections.Counter()

    def spy(module: Any, name: str) -> None:
        fn: Callable[..., Any] = getattr(module, name)

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            return fn(*args, **kwargs)

        monkeypatch.setattr(module, name, wrapped)

    for module, name in [
        (darts, "allocate"),
        (darts, "normalise"),
        (budget, "total_budget"),
        (budget, "marginal_cost"),
        (budget, "rollout_time_dp"),
        (budget, "fit_ptl"),
        (stats, "update"),
        (stats, "sigmas"),
        (selection, "select"),
        (selection, "group_advantages"),
    ]:
        spy(module, name)
    sim.run(CFG, sim.SYSTEMS["darts"])
    steps, groups = CFG.steps, CFG.steps * CFG.batch
    assert calls["allocate"] == calls["total_budget"] == calls["sigmas"] == calls["update"] == steps
    assert calls["select"] == calls["group_advantages"] == groups and calls["fit_ptl"] == 1
    assert calls["rollout_time_dp"] == steps and calls["marginal_cost"] == steps


def test_first_step_is_standard_sampling_and_the_budget_grows_after() -> None:
    result = sim.run(CFG, sim.SYSTEMS["darts"])
    first = result.steps[0]
    assert first.budget == CFG.batch * CFG.group and first.candidates == first.budget and first.aborted == 0
    assert max(s.budget for s in result.steps[1:]) > CFG.batch * CFG.group  # S_t > 0 once lengths are seen


def test_verl_trains_every_candidate_and_never_aborts() -> None:
    result = sim.run(CFG, sim.SYSTEMS["verl"])
    assert all(s.candidates == CFG.batch * CFG.group and s.aborted == 0 for s in result.steps)
    assert result.trained_samples == CFG.steps * CFG.batch * CFG.group


def test_saturated_prompts_stop_at_their_mth_valid_completion() -> None:
    """Digest acceptance (e): with the whole budget (every pool M_up), the rollout lasts exactly as long
    as Eq. 4 over lengths cut at each prompt's M-th valid completion."""
    cfg = dataclasses.replace(CFG, lam=1e-9, steps=3)
    run = sim._Run(cfg, sim.SYSTEMS["darts"])
    run.step()  # step 1 is standard; from step 2 the budget is the cap
    drawn: list[list[tuple[float, int, bool, float]]] = []
    original = run._draw

    def recording(q: int) -> tuple[float, int, bool, float]:
        d = original(q)
        if len(drawn) == 0 or len(drawn[-1]) == cfg.m_up:
            drawn.append([])
        drawn[-1].append(d)
        return d

    run._draw = recording  # type: ignore[method-assign]
    record, _ = run.step()
    assert record.saturated == cfg.batch and record.candidates == cfg.batch * cfg.m_up
    ends = []
    for pool in drawn:
        valid = sorted(n for _, n, t, _ in pool if not t)
        cut = valid[cfg.group - 1] if len(valid) >= cfg.group else max(n for _, n, _, _ in pool)
        ends.append([min(n, cut) for _, n, _, _ in pool])
    where = run._place([cfg.m_up] * cfg.batch)
    replicas: list[list[float]] = [[] for _ in range(cfg.replicas)]
    for i, e in enumerate(ends):
        replicas[where[i]] += e
    assert record.rollout_s == pytest.approx(budget.rollout_time_dp(replicas, run.ptl))
    cut_short = sum(
        n < d[1] for e, pool in zip(ends, drawn, strict=True) for n, d in zip(e, pool, strict=True)
    )
    assert record.aborted == cut_short > 0


def test_uniform_weights_spread_the_budget_evenly() -> None:
    assert darts.allocate(allocation.normalise([1.0] * 4), 4 * 8 + 6, 8, 16) == [10, 10, 9, 9]


def test_tail_batching_trains_the_first_n_groups_and_replays_the_deferred_as_a_step() -> None:
    cfg = dataclasses.replace(CFG, oversample=0.5, steps=4)  # 24 prompts a step, 16 trained, 8 deferred
    run = sim._Run(cfg, sim.SYSTEMS["tail-batching"])
    first, trained = run.step()
    assert trained == cfg.batch * cfg.group and first.candidates == 24 * cfg.group and first.aborted > 0
    assert len(run.deferred) == 8
    run.step()
    assert len(run.deferred) == 16
    tail, _ = run.step()  # the deferred prompts, all of them to completion
    assert run.deferred == [] and tail.candidates == cfg.batch * cfg.group and tail.aborted == 0
