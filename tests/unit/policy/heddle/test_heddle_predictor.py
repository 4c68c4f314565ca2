"""History predictor: hand-checked residuals, windows, and its error on a synthetic long-tailed task."""

from __future__ import annotations

import dataclasses
import random

import pytest

from treadle.errors import SpecError
from treadle.policy.heddle import predictor

F = predictor.Finished
Obs = predictor.Observation


def test_mean_residual_life_hand_checked() -> None:
    model = predictor.learn(
        predictor.HistoryModel(), [F("code", f"g{i}", t) for i, t in enumerate([100, 200, 600])]
    )
    # nothing generated yet: mean of all minus 0 = 300
    assert model.predict(Obs("code", "new", 0)) == pytest.approx(300)
    # 150 generated: only 200 and 600 remain possible: (200 + 600) / 2 - 150 = 250
    assert model.predict(Obs("code", "new", 150)) == pytest.approx(250)
    # past everything seen: assume it runs as long again
    assert model.predict(Obs("code", "new", 700)) == pytest.approx(700)
    # unknown task: the prior
    assert model.predict(Obs("math", "new", 10)) == 0.0


def test_step_conditioning_compares_progress() -> None:
    history = [
        F("code", "a", 1000, (100, 300, 600)),  # a long first step, a long trajectory
        F("code", "b", 100, (10, 40, 50)),  # a short first step, a short one
        F("code", "c", 60, (20, 40)),  # two steps only: not past step 2
    ]
    model = predictor.learn(predictor.HistoryModel(neighbours=1), history)
    # after one step of 95 tokens the closest first step is a's (100): 900 were still to come
    assert model.predict(Obs("code", "new", 95, steps_done=1)) == pytest.approx(900)
    # after one step of 12 tokens the closest is b's (10): 90 to come
    assert model.predict(Obs("code", "new", 12, steps_done=1)) == pytest.approx(90)
    # after two steps (a: 400, b: 50 done; c ended at 2 steps) 60 tokens sit nearest b: 50 to come
    assert model.predict(Obs("code", "new", 60, steps_done=2)) == pytest.approx(50)
    # too few went past step 3: fall back to the mean residual life
    assert model.predict(Obs("code", "new", 500, steps_done=3)) == pytest.approx(500)
    two = predictor.learn(predictor.HistoryModel(neighbours=2), history)
    # step 1 with two neighbours around 15: b (10) and c (20): (90 + 40) / 2
    assert two.predict(Obs("code", "new", 15, steps_done=1)) == pytest.approx(65)


def test_group_siblings_shrink_towards_the_task() -> None:
    history = [F("code", f"other{i}", 1000) for i in range(8)] + [F("code", "g", 100), F("code", "g", 140)]
    model = predictor.learn(predictor.HistoryModel(shrink=2.0), history)
    # task: (8·1000 + 100 + 140) / 10 = 824; group: 120, n_g = 2 -> (2·120 + 2·824) / 4 = 472
    assert model.predict(Obs("code", "g", 0)) == pytest.approx(472)
    assert model.predict(Obs("code", "stranger", 0)) == pytest.approx(824)


def test_credibility_estimated_from_the_groups_hand_checked() -> None:
    # groups a (100, 140) and b (300, 340): n 4, 2 groups, sum 880, sum of squares 235,200,
    # sum of S_g² / n_g = 240²/2 + 640²/2 = 233,600, sum of n_g² = 8
    # EPV = (235,200 - 233,600) / (4 - 2) = 800; between = 233,600 - 880²/4 = 40,000
    # VHM = (40,000 - (2 - 1)·800) / (4 - 8/4) = 19,600; k = 800 / 19,600 = 2/49
    history = [F("code", "a", 100), F("code", "a", 140), F("code", "b", 300), F("code", "b", 340)]
    model = predictor.learn(predictor.HistoryModel(shrink=None), history)
    assert model.k == pytest.approx(2 / 49)
    # a: group 120 (n_g 2), task 220: (2·120 + 2/49·220) / (2 + 2/49) = 122
    assert model.predict(Obs("code", "a", 0)) == pytest.approx(122)
    # the fixed default: (2·120 + 4·220) / 6 = 186.7
    assert predictor.learn(predictor.HistoryModel(), history).predict(Obs("code", "a", 0)) == pytest.approx(
        560 / 3
    )


def test_credibility_trusts_siblings_that_end_alike_and_ignores_noise() -> None:
    alike = [F("t", "short", 64), F("t", "short", 64), F("t", "long", 1536), F("t", "long", 1536)]
    model = predictor.learn(predictor.HistoryModel(shrink=None), alike)
    assert model.k == 0.0  # no within-group variance: the group is the prediction
    assert model.predict(Obs("t", "long", 0)) == pytest.approx(1536)
    assert model.predict(Obs("t", "short", 32)) == pytest.approx(32)
    # means 200 and 220 differ less than the within-group spread (EPV 14,900) explains: VHM < 0
    noise = [F("t", "a", 100), F("t", "a", 300), F("t", "b", 150), F("t", "b", 290)]
    model = predictor.learn(predictor.HistoryModel(shrink=None), noise)
    assert model.k == float("inf")
    assert model.predict(Obs("t", "a", 0)) == pytest.approx(210)  # the task's 840 / 4, not a's 200
    # evicting a group takes it out of the estimate: none repeated is left, back to the prior 4
    model = predictor.learn(dataclasses.replace(model, groups_kept=1), [F("t", "c", 10), F("t", "c", 30)])
    assert list(model.groups) == ["c"]
    assert model.k is None
    # c: group 20 (n_g 2), task window a, b, c: 880 / 6: (2·20 + 4·880/6) / 6 = 104.4
    assert model.predict(Obs("t", "c", 0)) == pytest.approx((40 + 4 * 880 / 6) / 6)


def test_windows_forget_the_oldest() -> None:
    model = predictor.HistoryModel(window=2, groups_kept=1)
    model = predictor.learn(model, [F("t", "a", 1000)])
    model = predictor.learn(model, [F("t", "b", 10), F("t", "b", 20)])
    assert model.predict(Obs("t", "x", 0)) == pytest.approx(15)  # 1000 fell out of the window
    assert list(model.groups) == ["b"]  # only the latest group is kept
    # learning returns a new model: the old one is unchanged
    assert predictor.HistoryModel().tasks == {}


def synthetic_task(rng: random.Random, name: str, groups: int, size: int = 16) -> list[tuple[str, list[int]]]:
    """Long-tailed lengths: a per-prompt difficulty and per-sample noise, both lognormal."""
    out = []
    for g in range(groups):
        difficulty = rng.lognormvariate(7.5, 0.8)
        out.append(
            (f"{name}{g}", [max(1, int(difficulty * rng.lognormvariate(0, 0.6))) for _ in range(size)])
        )
    return out


def test_error_on_a_synthetic_task() -> None:
    rng = random.Random(7)
    model = predictor.HistoryModel()
    for group, lengths in synthetic_task(rng, "past", 64):
        model = predictor.learn(model, [F("code", group, t) for t in lengths])
    # a new step: half of each group has finished (their lengths are known), half still runs
    preds_step0, preds_progress, actual_step0, actual_progress = [], [], [], []
    constant = []
    for group, lengths in synthetic_task(rng, "now", 32):
        done, running = sorted(lengths)[:8], sorted(lengths)[8:]
        progressed = predictor.learn(model, [F("code", group, t) for t in done])
        for total in running:
            seen = done[-1]  # it has generated at least as much as the longest finished sibling
            preds_step0.append(model.predict(Obs("code", group, 0)))
            actual_step0.append(float(total))
            preds_progress.append(progressed.predict(Obs("code", group, seen)))
            actual_progress.append(float(total - seen))
            constant.append(model.predict(Obs("code", "unknown-group", seen)))
    before = predictor.accuracy(preds_step0, actual_step0)
    after = predictor.accuracy(preds_progress, actual_progress)
    task_only = predictor.accuracy(constant, actual_progress)
    print(f"step 0: {before}\nprogressive: {after}\ntask only: {task_only}")
    # prompt-only knowledge ranks nothing (every trajectory of the task gets one number)
    assert before.pearson == 0.0
    # progress (tokens generated so far) predicts the remaining length and finds half the tail
    assert after.pearson > 0.5
    assert after.long_tail_recall >= 0.5
    assert after.mae < before.mae
    # finished siblings are all shorter than the running ones here, so the group term adds nothing
    # beyond the task (the documented limit of a history predictor)
    assert after == task_only


def test_accuracy_hand_checked() -> None:
    acc = predictor.accuracy([10, 20, 30, 40], [10, 20, 30, 80], tail=0.25)
    assert acc.mae == pytest.approx(10)
    assert acc.long_tail_recall == 1.0  # the longest is predicted longest
    assert acc.median_ratio_error == pytest.approx(1.0)
    assert 0.9 < acc.pearson < 1.0


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: predictor.HistoryModel(window=0), "window"),
        (lambda: predictor.HistoryModel(shrink=0), "shrink"),
        (lambda: predictor.HistoryModel(prior=-1), "prior"),
        (lambda: predictor.learn(predictor.HistoryModel(), [F("t", "g", -5)]), "finished[0].total_tokens"),
        (
            lambda: predictor.learn(predictor.HistoryModel(), [F("t", "g", 5, (1, 2))]),
            "finished[0].step_tokens",
        ),
        (lambda: predictor.HistoryModel(neighbours=0), "neighbours"),
        (lambda: predictor.accuracy([], []), "predicted"),
        (lambda: predictor.accuracy([1], [1], tail=0), "tail"),
    ],
    ids=["window", "shrink", "prior", "negative", "steps-sum", "neighbours", "empty", "tail"],
)
def test_bad_input_names_the_field(build: object, field: str) -> None:
    with pytest.raises(SpecError) as err:
        build()  # type: ignore[operator]
    assert err.value.field == field


@pytest.mark.parametrize("window", [64, 300])
def test_incremental_learns_predict_exactly_as_a_rebuild(window: int) -> None:
    # learn splices each batch into its sorted indexes; a model learned in one call sorts them whole
    rng = random.Random(7)
    params = {"window": window, "neighbours": 8, "max_steps": 5}
    model, finished = predictor.HistoryModel(**params), []
    probes = [
        Obs(task, f"g{g}", x, s) for task in ("code", "math") for g in (1, 2) for x in (0, 40) for s in (0, 2)
    ]
    for n in range(120):
        batch = []
        for _ in range(rng.choice([1, 3, 8, 8, 8, 40])):  # small batches splice, large ones re-sort
            steps = tuple(rng.randint(0, 30) for _ in range(rng.choice([0, 1, 2, 4, 7])))  # ties, no steps
            total = sum(steps) if steps else rng.randint(0, 200)
            batch.append(F(rng.choice(["code", "math"]), f"g{rng.randrange(50)}", total, steps))
        model, finished = predictor.learn(model, batch), finished + batch
        if n == 50:  # a model whose lists later learns copy and splice
            first, before = model, [model.predict(o) for o in probes]
        if n % 20 == 19:
            rebuilt = predictor.learn(predictor.HistoryModel(**params), finished)
            for _ in range(300):
                obs = Obs(
                    rng.choice(["code", "math"]),
                    f"g{rng.randrange(60)}",
                    rng.randint(0, 220),
                    rng.randint(0, 7),
                )
                assert model.predict(obs) == rebuilt.predict(obs), obs
    assert len(finished) > 2 * window  # both tasks' windows have been evicting
    assert [first.predict(o) for o in probes] == before  # learn never mutates a model
