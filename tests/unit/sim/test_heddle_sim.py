"""The Heddle step simulator: a small long-tailed step where Heddle must beat the baselines."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from treadle.errors import SpecError
from treadle.policy import costmodel
from treadle.sim import heddle
from treadle.sim import workloads as w
from treadle.sim.heddle import workload

CODING = heddle.Domain(
    "coding",
    steps=w.Dist("lognormal", 4, cv=0.8, low=1, high=20),
    prompt_tokens=w.Dist("lognormal", 600, cv=0.3),
    response_tokens=w.Dist("lognormal", 800, cv=1.2, high=12000),
    observation_tokens=w.Dist("lognormal", 300, cv=0.5),
    tool_latency_s=w.Dist("lognormal", 0.4, cv=0.5),
    difficulty_cv=1.0,
    sample_cv=0.5,
    predict_s=0.1,
)
FCFS_LEAST_LOAD = heddle.System("fcfs-least-load", "fcfs", "least-load", tp=0, least_load_abs=0)
"""A step-centric baseline: FCFS queues, per-step least-loaded placement, homogeneous TP 1."""


def _config(seed: int) -> heddle.StepConfig:
    # 4 H800s, 128 trajectories in GRPO groups of 8: seconds of CPU, minutes of simulated rollout.
    # Sized on the predictions the planner splits the GPUs into several workers, so placement,
    # routing and migration have something to do (on the previous epoch it takes one TP-4 worker).
    return heddle.StepConfig(
        domain=CODING,
        model=costmodel.QWEN3_8B,
        gpus=4,
        per_worker=32,
        group_size=8,
        max_seqs=32,
        seed=seed,
        plan_on="predictions",
    )


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_heddle_finishes_a_long_tailed_step_before_the_baselines(seed: int) -> None:
    systems = [heddle.HEDDLE, FCFS_LEAST_LOAD, heddle.SYSTEMS["verl"], heddle.SYSTEMS["place-least-load"]]
    ours, fcfs_ll, verl, least_load = heddle.run(_config(seed), systems)
    # the same batch for everyone, every trajectory finished
    assert ours.output_tokens == fcfs_ll.output_tokens == verl.output_tokens == least_load.output_tokens
    assert ours.trajectories == 128 and ours.label == "simulated"
    assert ours.makespan_s < fcfs_ll.makespan_s
    assert ours.makespan_s < verl.makespan_s
    # same scheduling and TP plan, only the placement differs: the presorted DP (+ migration) wins
    assert least_load.degrees == ours.degrees
    assert ours.makespan_s < least_load.makespan_s


def test_heddle_uses_its_mechanisms_and_scores_the_predictor() -> None:
    (ours,) = heddle.run(_config(1), [heddle.HEDDLE])
    assert sum(ours.degrees) == 4 and max(ours.degrees) > 1  # the TP planner gave the tail a wider worker
    assert ours.migrations > 0 and ours.preemptions > 0
    assert ours.exposed_migration_s >= 0
    steps = dict(ours.accuracy)
    assert 0 in steps and 1 in steps
    assert steps[0].n == 128  # one prediction per trajectory at dispatch
    assert all(-1 <= a.pearson <= 1 and 0 <= a.long_tail_recall <= 1 for a in steps.values())


def test_deterministic_for_a_seed() -> None:
    a = heddle.run(_config(2), [heddle.HEDDLE])[0]
    b = heddle.run(_config(2), [heddle.HEDDLE])[0]
    assert (a.makespan_s, a.migrations, a.preemptions) == (b.makespan_s, b.migrations, b.preemptions)


def test_draw_batch_shares_difficulty_within_a_group_and_caps_output() -> None:
    import random

    domain = dataclasses.replace(CODING, max_output_tokens=5000)
    batch = heddle.draw_batch(domain, prompts=20, group_size=8, rng=random.Random(0))
    assert len(batch) == 160 and [s.group for s in batch[:9]] == [0] * 8 + [1]
    assert max(s.output for s in batch) <= 5000
    assert all(len(s.inputs) == len(s.responses) == len(s.tools) >= 1 for s in batch)


def test_group_steps_deals_a_choice_to_whole_groups_as_the_live_bench_mix_does() -> None:
    import random

    mix = w.Dist("choice", 2.16, low=2, high=16, values=(16.0, 2.0), weights=(1.0, 100.0))
    domain = dataclasses.replace(CODING, steps=mix, difficulty_cv=0.0, sample_cv=0.0, group_steps=True)
    for seed in range(5):
        batch = heddle.draw_batch(domain, prompts=101, group_size=2, rng=random.Random(seed))
        steps = {(s.group, len(s.responses)) for s in batch}
        assert len(steps) == 101  # siblings share their group's count
        assert sorted(n for _, n in steps).count(16) == 1  # exactly the weights' share: 1 group in 101
        again = workload.redraw(domain, batch, 2, random.Random(seed + 1))
        assert {(s.group, len(s.responses)) for s in again} == steps
    # without it a choice is drawn per sample: siblings part and the long count varies by seed
    apart = dataclasses.replace(domain, group_steps=False)
    batches = [heddle.draw_batch(apart, prompts=101, group_size=2, rng=random.Random(k)) for k in range(10)]
    longs = {sum(len(s.responses) == 16 for s in batch) for batch in batches}
    assert len(longs) > 1


def test_group_steps_must_be_a_boolean() -> None:
    raw = yaml.safe_load((Path(__file__).parents[3] / "bench/scenarios/heddle/live-tools.yaml").read_text())
    domain = raw["simulation"]["domains"]["math-tool"]
    assert heddle.parse_domain(domain, name="m", field="d").group_steps
    with pytest.raises(SpecError) as err:
        heddle.parse_domain({**domain, "group_steps": "yes"}, name="m", field="d")
    assert err.value.field == "d.group_steps"


def test_a_fixed_tp_that_does_not_fit_names_the_field() -> None:
    cfg = dataclasses.replace(_config(0), gpus=2, per_worker=8)
    with pytest.raises(SpecError) as err:
        heddle.run(cfg, [heddle.SYSTEMS["fix-8"]])
    assert err.value.field == "tp"


def test_shipped_scenario_parses() -> None:
    raw = yaml.safe_load((Path(__file__).parents[3] / "bench/scenarios/heddle/agentic.yaml").read_text())
    sim = raw["simulation"]
    for name, d in sim["domains"].items():
        domain = heddle.parse_domain(d, name=name, field=f"simulation.domains.{name}")
        assert domain.max_output_tokens == 40960
    for model, tp in sim["models"].items():
        costmodel.model(model)
        assert tp in (1, 2)
    with pytest.raises(SpecError):
        heddle.parse_domain({"steps": 3}, name="x", field="simulation.domains.x")


def test_the_simulator_calls_the_policy_functions(monkeypatch: pytest.MonkeyPatch) -> None:
    """Heddle's mechanisms in the simulator are the ``treadle.policy.heddle`` functions themselves."""
    from treadle.policy.heddle import migration, predictor, presorted_dp, priority, router, tp_planner

    calls: dict[str, int] = {}
    targets = [
        (predictor.HistoryModel, "predict"),
        (predictor, "learn"),
        (priority, "run_to_completion"),
        (presorted_dp, "plan"),
        (router, "on_step"),
        (router, "route"),
        (migration, "schedule_epoch"),
        (tp_planner, "plan"),
    ]
    for owner, name in targets:
        original = getattr(owner, name)
        key = f"{getattr(owner, '__name__', '')}.{name}"

        def counted(*args: object, _original: object = original, _key: str = key, **kwargs: object) -> object:
            calls[_key] = calls.get(_key, 0) + 1
            return _original(*args, **kwargs)  # type: ignore[operator]

        monkeypatch.setattr(owner, name, counted)
    heddle.run(_config(1), [heddle.HEDDLE])
    assert set(calls) == {f"{getattr(o, '__name__', '')}.{n}" for o, n in targets}, calls


def test_degree_profile_from_the_roofline() -> None:
    cfg = dataclasses.replace(_config(0), model=costmodel.QWEN3_32B)
    assert (
        heddle.degree_profile(cfg, 1, [1.0], 4000, 10) is None
    )  # 32B leaves no room for a 40K tail on 1 GPU
    p2 = heddle.degree_profile(cfg, 2, [1.0], 4000, 10)
    p8 = heddle.degree_profile(cfg, 8, [1.0], 4000, 10)
    assert p2 is not None and p8 is not None
    assert p8.t_base < p2.t_base  # wider is faster per token at batch one
    assert p2.interference[0] == pytest.approx(1.0) and len(p2.interference) == 10
    assert list(p2.interference) == sorted(p2.interference)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_the_tp_plan_is_never_clearly_worse_than_a_fixed_tp_in_the_simulator(seed: int) -> None:
    """The planner and the simulator agree: Heddle's TP plan is not beaten by Fix-1/2/4/8.

    Exact predictions (a noise-free oracle), so only the planner's cost model is under test, not
    the predictor. Before the planner simulated every placed group's own members, it priced the
    short trajectories' groups with the batch-shaped ``I(s)`` and, at seed 0, chose 1xTP4 + 2xTP2
    (152 s simulated) over Fix-8 (111 s).
    """
    cfg = dataclasses.replace(
        _config(seed),
        model=costmodel.QWEN3_14B,
        gpus=8,
        per_worker=16,
        max_seqs=16,
        predictions="noisy-oracle",
        oracle_sigma=(0.0,),
    )
    fixed = [dataclasses.replace(heddle.HEDDLE, name=f"fix-{g}", tp=g) for g in (1, 2, 4, 8)]
    ours, *alternatives = heddle.run(cfg, [heddle.HEDDLE, *fixed])
    best = min(alternatives, key=lambda r: r.makespan_s)
    assert ours.makespan_s <= 1.05 * best.makespan_s, (ours.degrees, best.degrees)


def test_the_tp_planner_sizes_the_pool_for_the_previous_epoch_or_the_predictions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from treadle.policy.heddle import tp_planner

    seen: list[list[float]] = []
    original = tp_planner.plan

    def spy(lengths: list[float], **kwargs: object) -> tp_planner.Plan:
        seen.append(sorted(lengths))
        return original(lengths, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(tp_planner, "plan", spy)
    exact = dataclasses.replace(_config(1), predictions="noisy-oracle", oracle_sigma=(0.0,))
    heddle.run(dataclasses.replace(exact, plan_on="previous-epoch"), [heddle.HEDDLE])
    heddle.run(exact, [heddle.HEDDLE])
    previous_epoch, predictions = seen
    import random

    rng = random.Random(exact.seed)
    batch = heddle.draw_batch(exact.domain, prompts=exact.trajectories // 8, group_size=8, rng=rng)
    assert predictions == sorted(float(s.output) for s in batch)  # exact predictions: the batch itself
    assert len(previous_epoch) == len(batch) and previous_epoch != predictions  # a redraw of the prompts
