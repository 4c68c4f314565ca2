"""``spec.tasks[].sampling``: modes, DARTS defaults from the paper, and the rules naming the field."""

from __future__ import annotations

from typing import Any

import pytest

from treadle import errors
from treadle.api import jobconfig, sampling, v1alpha1
from treadle.policy.darts import stats


def _spec(**task: Any) -> dict[str, Any]:
    return {
        "agents": [{"name": "a", "model": "m"}],
        "pools": [{"name": "p", "agent": "a", "accelerator": "H20"}],
        "tasks": [{"name": "t", "agents": ["a"], "environment": "math-tool", "reward": "r", **task}],
    }


def test_redundancy_alone_keeps_working_and_means_redundant() -> None:
    task = v1alpha1.parse_spec(_spec(redundancy=0.5)).tasks[0]
    assert task.sampling.mode is None and task.sampling.resolved_mode(task.redundancy) == "redundant"
    plain = v1alpha1.parse_spec(_spec()).tasks[0]
    assert plain.sampling.resolved_mode(plain.redundancy) == "standard"
    named = v1alpha1.parse_spec(_spec(redundancy=0.25, sampling={"mode": "redundant"})).tasks[0]
    assert named.sampling.resolved_mode(named.redundancy) == "redundant"


def test_darts_defaults_are_the_papers_where_it_gives_them() -> None:
    task = v1alpha1.parse_spec(_spec(groupSize=8, sampling={"mode": "darts"})).tasks[0]
    settings = task.sampling.settings(task.group_size)
    assert (settings.m_up, settings.long_end) == (16, 1)  # M_up = 2M, 1:7 of 8
    assert settings.lam == sampling.DEFAULT_LAMBDA and settings.ema_decay == stats.DEFAULT_DECAY
    given = {"mode": "darts", "mUp": 12, "longEnd": 2, "lambda": 0.5, "emaDecay": 0.9}
    task = v1alpha1.parse_spec(_spec(sampling=given)).tasks[0]
    assert task.sampling.settings(8) == sampling.DartsSettings(m_up=12, long_end=2, lam=0.5, ema_decay=0.9)
    assert task.model_dump(by_alias=True)["sampling"]["lambda"] == 0.5
    assert (settings.keep_unselected, settings.length) == (False, "tokens")  # counted only; tokens
    kept = v1alpha1.parse_spec(_spec(sampling={"mode": "darts", "keepUnselected": True, "length": "turns"}))
    settings = kept.tasks[0].sampling.settings(8)
    assert (settings.keep_unselected, settings.length) == (True, "turns")


@pytest.mark.parametrize(
    ("task", "field"),
    [
        ({"redundancy": 0.5, "sampling": {"mode": "darts"}}, "spec.tasks.redundancy"),
        ({"redundancy": 0.5, "sampling": {"mode": "standard"}}, "spec.tasks.redundancy"),
        ({"sampling": {"mode": "redundant"}}, "spec.tasks.redundancy"),
        ({"sampling": {"mode": "standard", "mUp": 16}}, "spec.tasks.sampling.mode"),
        ({"sampling": {"lambda": 0.1}}, "spec.tasks.sampling.mode"),
        ({"groupSize": 8, "sampling": {"mode": "darts", "mUp": 7}}, "spec.tasks.sampling.mUp"),
        ({"groupSize": 4, "sampling": {"mode": "darts", "longEnd": 4}}, "spec.tasks.sampling.longEnd"),
        ({"sampling": {"mode": "darts", "emaDecay": 1.0}}, "spec.tasks[0].sampling.emaDecay"),
        ({"sampling": {"mode": "darts", "lambda": 0}}, "spec.tasks[0].sampling.lambda"),
        ({"sampling": {"mode": "sometimes"}}, "spec.tasks[0].sampling.mode"),
        ({"sampling": {"mode": "standard", "keepUnselected": True}}, "spec.tasks.sampling.mode"),
        ({"sampling": {"length": "turns"}}, "spec.tasks.sampling.mode"),
        ({"sampling": {"mode": "darts", "length": "chars"}}, "spec.tasks[0].sampling.length"),
    ],
    ids=[
        "darts+redundancy", "standard+redundancy", "redundant-without", "darts-field-standard",
        "darts-field-no-mode", "m-up-below-group", "long-end-whole-group", "decay-1", "lambda-0", "bad-mode",
        "keep-unselected-standard", "length-no-mode", "bad-length",
    ],
)  # fmt: skip
def test_invalid_sampling_is_refused_naming_the_field(task: dict[str, Any], field: str) -> None:
    with pytest.raises(errors.SpecError) as info:
        v1alpha1.parse_spec(_spec(**task))
    assert info.value.field == field


def test_job_config_carries_the_mode_and_the_darts_settings() -> None:
    spec = _spec(groupSize=4, sampling={"mode": "darts", "longEnd": 2})
    spec["tasks"].append(
        {"name": "u", "agents": ["a"], "environment": "math-tool", "reward": "r", "redundancy": 0.5}
    )
    job = v1alpha1.parse_job(
        {"apiVersion": v1alpha1.API_VERSION, "kind": v1alpha1.KIND, "metadata": {"name": "j"}, "spec": spec}
    )
    tasks = {
        t.name: t
        for t in jobconfig.job_config(
            job, max_tokens=64, max_in_flight=8, max_concurrent_generations=4
        ).scheduler.tasks
    }
    darts = tasks["t"]
    assert (darts.sampling, darts.m_up, darts.long_end, darts.lam) == ("darts", 8, 2, sampling.DEFAULT_LAMBDA)
    assert darts.ema_decay == stats.DEFAULT_DECAY
    assert (darts.keep_unselected, darts.length) == (False, "tokens")
    redundant = tasks["u"]
    assert (redundant.sampling, redundant.members, redundant.m_up) == (
        "redundant",
        12,
        0,
    )  # 8 + ceil(0.5 · 8), as before
