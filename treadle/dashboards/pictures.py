"""A picture of a dashboard: its panels drawn with matplotlib from the same queries, over a window of a
real Prometheus. The tests that run a job under Prometheus (``e2e/learn/test_metrics`` on the dev
cluster, ``tests/integration/foundation/test_dashboards_prometheus`` in local mode) write them when
``TREADLE_DASHBOARD_PICTURES`` names a folder; ``docs/dashboards/`` holds what they drew. matplotlib
is the ``sim`` extra's (and the dev extra's), so only those tests import this module."""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any, Protocol

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt

from treadle.dashboards import model

FOLDER_VARIABLE = "TREADLE_DASHBOARD_PICTURES"
_LEGEND = re.compile(r"\{\{\s*(\w+)\s*\}\}")


class RangeQueries(Protocol):
    """A Prometheus answering range queries (``treadle.testing.prometheus_server.PrometheusServer``)."""

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]: ...


def folder() -> Path | None:
    """Where the pictures go: ``$TREADLE_DASHBOARD_PICTURES``, or None to draw none."""
    value = os.environ.get(FOLDER_VARIABLE)
    return Path(value) if value else None


def legend(template: str, labels: dict[str, str]) -> str:
    return _LEGEND.sub(lambda m: labels.get(m.group(1), ""), template)


def draw(
    dashboard: model.Dashboard,
    prom: RangeQueries,
    *,
    variables: dict[str, str],
    start: float,
    end: float,
    out: Path,
    source: str,
) -> Path:
    """``out/<uid>.png``: every panel of ``dashboard``, two to a row as in Grafana; ``source`` (what ran,
    where) goes under the title."""
    rendered = model.render(dashboard)
    panels: list[dict[str, Any]] = rendered["panels"]
    rows = math.ceil(len(panels) / 2)
    fig, axes = plt.subplots(rows, 2, figsize=(14, 3.2 * rows), squeeze=False)
    step = max(2.0, (end - start) / 300)
    for ax, panel in zip(axes.flat, panels, strict=False):
        for target in panel["targets"]:
            expr = model.resolve(target["expr"], **variables)
            for series in prom.query_range(expr, start, end, step):
                xs = [(float(t) - start) / 60 for t, _ in series["values"]]
                ys = [float(v) for _, v in series["values"]]
                ax.plot(xs, ys, label=legend(target["legendFormat"], series["metric"]) or expr[:40])
        ax.set_title(panel["title"], fontsize=9)
        ax.set_xlabel("minutes", fontsize=7)
        ax.tick_params(labelsize=7)
        ax.set_ylabel(panel["fieldConfig"]["defaults"]["unit"], fontsize=7)
        if ax.lines:
            ax.legend(fontsize=6, loc="upper left")
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    fig.suptitle(f"{dashboard.title}  ({source})")
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.5 / fig.get_figheight()))  # half an inch for the title
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{dashboard.uid}.png"
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path
