"""Dashboards read only metrics Treadle defines, and the committed JSON is current."""

from __future__ import annotations

import json
import re

import pytest

from treadle import metrics
from treadle.dashboards import __main__ as dashboards_main
from treadle.dashboards import catalog, model

PER_JOB_OPERATOR = {metrics.OPERATOR_JOB_INFO, metrics.OPERATOR_JOB_CONDITION, metrics.OPERATOR_POOL_REPLICAS}
DEFINED = {v for k, v in vars(metrics).items() if k.isupper() and isinstance(v, str) and k != "PREFIX"}


@pytest.mark.parametrize(
    ("expr", "want"),
    [
        ("sum(rate(treadle_buffer_put_total[1m]))", {"treadle_buffer_put_total"}),
        (
            "histogram_quantile(0.99, sum by (le) (rate(treadle_env_step_seconds_bucket[1m])))",
            {"treadle_env_step_seconds"},
        ),
        ("sum(a_sum) / sum(vllm:num_requests_running)", {"vllm:num_requests_running"}),
        ("sum(rate(vllm:generation_tokens_total[1m]))", {"vllm:generation_tokens"}),
        ('max(treadle_trainer_phase_seconds_sum{phase="publish"})', {"treadle_trainer_phase_seconds"}),
    ],
    ids=["counter", "histogram-bucket", "vllm-colon-name", "vllm-counter", "selector"],
)
def test_metric_names_strips_histogram_suffixes(expr: str, want: set[str]) -> None:
    assert model.metric_names(expr) == want


@pytest.mark.parametrize("dashboard", catalog.ALL, ids=[d.uid for d in catalog.ALL])
def test_every_query_names_only_defined_metrics(dashboard: model.Dashboard) -> None:
    for panel in dashboard.panels:
        for target in panel.targets:
            names = model.metric_names(target.expr)
            assert names, f"{panel.title!r}: query names no metric: {target.expr}"
            assert names <= DEFINED, f"{panel.title!r}: undefined {sorted(names - DEFINED)}"


def test_committed_dashboards_are_current() -> None:
    for name, text in dashboards_main.rendered().items():
        path = dashboards_main.OUT_DIR / name
        assert path.is_file(), f"{path} missing: run `python -m treadle.dashboards`"
        assert path.read_text() == text, f"{path} out of date: run `python -m treadle.dashboards`"


def test_rendered_panels_have_one_ref_id_per_target_and_no_overlap() -> None:
    for dashboard in catalog.ALL:
        rendered = model.render(dashboard)
        positions = set()
        for panel_json, panel in zip(rendered["panels"], dashboard.panels, strict=True):
            assert [t["refId"] for t in panel_json["targets"]] == [
                chr(65 + i) for i in range(len(panel.targets))
            ]
            grid = panel_json["gridPos"]
            assert (grid["x"], grid["y"]) not in positions
            positions.add((grid["x"], grid["y"]))
        json.dumps(rendered)  # serialisable


def test_scoped_puts_the_job_matcher_on_every_series_and_keeps_their_selectors() -> None:
    expr = 'sum(rate(treadle_a_total[1m])) / max(treadle_b{phase="x"}) + vllm:c_total'
    assert model.scoped(expr, 'job="j"') == (
        'sum(rate(treadle_a_total{job="j"}[1m])) / max(treadle_b{job="j", phase="x"}) + vllm:c_total{job="j"}'
    )
    assert model.scoped(expr, "") == expr
    assert (
        model.resolve('x{namespace=~"$namespace", job=~"$job"}', job="learn")
        == 'x{namespace=~".*", job=~"learn"}'
    )


@pytest.mark.parametrize("dashboard", catalog.ALL, ids=[d.uid for d in catalog.ALL])
def test_every_dashboard_selects_by_namespace_and_job(dashboard: model.Dashboard) -> None:
    rendered = model.render(dashboard)
    variables = {v["name"]: v for v in rendered["templating"]["list"]}
    assert {"namespace", "job"} <= set(variables)
    assert "$namespace" in variables["job"]["definition"]
    for panel in rendered["panels"]:
        for target in panel["targets"]:
            selectors = re.findall(r"(?:treadle_|vllm:)[a-zA-Z0-9_:]*(\{[^}]*\})?", target["expr"])
            for selector in selectors:
                if dashboard.matcher:
                    assert dashboard.matcher in selector, (panel["title"], target["expr"])
            per_job = model.metric_names(target["expr"]) & PER_JOB_OPERATOR
            if not dashboard.matcher and per_job:  # the operator's per-job series name their job
                assert 'name=~"$job"' in target["expr"], target["expr"]
