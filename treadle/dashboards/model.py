"""Panels and dashboards as plain data, and their rendering to Grafana's JSON model."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

from treadle import metrics

Unit = Literal["short", "s", "ops", "percentunit", "none", "Bps"]
WINDOW = "1m"


@dataclass(frozen=True)
class Target:
    """One query of a panel and its legend."""

    expr: str
    legend: str = "__auto"


@dataclass(frozen=True)
class Panel:
    """One time-series panel with one or more queries."""

    title: str
    targets: tuple[Target, ...]
    unit: Unit = "short"


def panel(title: str, *exprs: str | tuple[str, str], unit: Unit = "short") -> Panel:
    """A panel from bare expressions or (expression, legend) pairs."""
    targets = tuple(Target(*e) if isinstance(e, tuple) else Target(e) for e in exprs)
    return Panel(title, targets, unit)


_SERIES = re.compile(r"\b(?:treadle_|vllm:)[a-zA-Z0-9_:]*")
_HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
_VLLM_COUNTER = "_total"
"""vLLM's counters are named without it (as ``treadle.metrics`` holds them) and exported with it."""


def metric_names(expr: str) -> set[str]:
    """The metric families an expression reads (histogram and vLLM counter series suffixes stripped)."""
    names = set()
    for series in _SERIES.findall(expr):
        for suffix in _HISTOGRAM_SUFFIXES:
            if series.endswith(suffix):
                series = series.removesuffix(suffix)
                break
        if series.startswith("vllm:"):
            series = series.removesuffix(_VLLM_COUNTER)
        names.add(series)
    return names


JOB_MATCHER = 'namespace=~"$namespace", job=~"$job"'
"""Every series of a job's pods carries its namespace and its RolloutJob's name as ``job`` (the
chart's scrape configuration and PodMonitor set both from the pod)."""
_SELECTED = re.compile(r"\b((?:treadle_|vllm:)[a-zA-Z0-9_:]*)(?:\{([^}]*)\})?")


def scoped(expr: str, matcher: str) -> str:
    """``expr`` with ``matcher`` added to the selector of every series it reads."""
    if not matcher:
        return expr
    return _SELECTED.sub(lambda m: f"{m.group(1)}{{{', '.join(filter(None, (matcher, m.group(2))))}}}", expr)


def resolve(expr: str, namespace: str = ".*", job: str = ".*") -> str:
    """A rendered expression with the dashboard's variables filled in, as Grafana sends it."""
    return expr.replace("$namespace", namespace).replace("$job", job)


@dataclass(frozen=True)
class Dashboard:
    uid: str
    title: str
    panels: tuple[Panel, ...]
    matcher: str = JOB_MATCHER
    """Added to every series of every panel; empty where panels filter by themselves (the operator's)."""
    variable_metric: str = metrics.SCHED_INFLIGHT
    """The series the ``namespace`` and ``job`` variables list values from (every job has a scheduler)."""
    job_label: str = "job"


def _series(metric: str, where: str) -> str:
    return f"{metric}{{{where}}}" if where else metric


def rate(metric: str, by: str = "", *, where: str = "") -> str:
    grouping = f" by ({by})" if by else ""
    return f"sum{grouping}(rate({_series(metric, where)}[{WINDOW}]))"


def quantile(q: float, histogram: str, by: str = "", *, where: str = "") -> str:
    labels = f"le, {by}" if by else "le"
    buckets = _series(histogram + "_bucket", where)
    return f"histogram_quantile({q}, sum by ({labels}) (rate({buckets}[{WINDOW}])))"


def mean(histogram: str, by: str = "", *, where: str = "") -> str:
    grouping = f" by ({by})" if by else ""
    total_, count = _series(histogram + "_sum", where), _series(histogram + "_count", where)
    return f"sum{grouping}(rate({total_}[{WINDOW}])) / sum{grouping}(rate({count}[{WINDOW}]))"


def total(gauge: str, by: str = "", *, where: str = "") -> str:
    grouping = f" by ({by})" if by else ""
    return f"sum{grouping}({_series(gauge, where)})"


def _variable(name: str, query: str) -> dict[str, Any]:
    """A query variable over label values, several or all selectable (``.*`` for all)."""
    return {
        "name": name,
        "label": name,
        "type": "query",
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "query": {"query": query, "refId": f"{name}-values"},
        "definition": query,
        "refresh": 2,
        "includeAll": True,
        "allValue": ".*",
        "multi": True,
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "sort": 1,
    }


def render(dashboard: Dashboard) -> dict[str, Any]:
    """Grafana dashboard JSON (schema 39), two panels per row, Prometheus datasource variable."""
    in_namespace = f'{dashboard.variable_metric}{{namespace=~"$namespace"}}'
    panels = []
    for i, panel in enumerate(dashboard.panels):
        panels.append(
            {
                "id": i + 1,
                "type": "timeseries",
                "title": panel.title,
                "datasource": {"type": "prometheus", "uid": "${datasource}"},
                "gridPos": {"h": 8, "w": 12, "x": 12 * (i % 2), "y": 8 * (i // 2)},
                "fieldConfig": {"defaults": {"unit": panel.unit}, "overrides": []},
                "targets": [
                    {
                        "refId": chr(ord("A") + j),
                        "expr": scoped(target.expr, dashboard.matcher),
                        "legendFormat": target.legend,
                        "datasource": {"type": "prometheus", "uid": "${datasource}"},
                    }
                    for j, target in enumerate(panel.targets)
                ],
            }
        )
    return {
        "uid": dashboard.uid,
        "title": dashboard.title,
        "tags": ["treadle"],
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "time": {"from": "now-1h", "to": "now"},
        "refresh": "10s",
        "templating": {
            "list": [
                {"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Prometheus"},
                _variable("namespace", f"label_values({dashboard.variable_metric}, namespace)"),
                _variable("job", f"label_values({in_namespace}, {dashboard.job_label})"),
            ]
        },
        "panels": panels,
    }
