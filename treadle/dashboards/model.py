"""Panels and dashboards as plain data, and their rendering to Grafana's JSON model."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

Unit = Literal["short", "s", "ops", "percentunit", "none"]
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


def metric_names(expr: str) -> set[str]:
    """The metric families an expression reads (histogram series suffixes stripped)."""
    names = set()
    for series in _SERIES.findall(expr):
        for suffix in _HISTOGRAM_SUFFIXES:
            if series.endswith(suffix):
                series = series.removesuffix(suffix)
                break
        names.add(series)
    return names


@dataclass(frozen=True)
class Dashboard:
    uid: str
    title: str
    panels: tuple[Panel, ...]


def rate(metric: str, by: str = "") -> str:
    grouping = f" by ({by})" if by else ""
    return f"sum{grouping}(rate({metric}[{WINDOW}]))"


def quantile(q: float, histogram: str, by: str = "") -> str:
    labels = f"le, {by}" if by else "le"
    return f"histogram_quantile({q}, sum by ({labels}) (rate({histogram}_bucket[{WINDOW}])))"


def mean(histogram: str, by: str = "") -> str:
    grouping = f" by ({by})" if by else ""
    return (
        f"sum{grouping}(rate({histogram}_sum[{WINDOW}])) / sum{grouping}(rate({histogram}_count[{WINDOW}]))"
    )


def total(gauge: str, by: str = "") -> str:
    grouping = f" by ({by})" if by else ""
    return f"sum{grouping}({gauge})"


def render(dashboard: Dashboard) -> dict[str, Any]:
    """Grafana dashboard JSON (schema 39), two panels per row, Prometheus datasource variable."""
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
                        "expr": target.expr,
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
            ]
        },
        "panels": panels,
    }
