"""Prometheus over the dev cluster's pods, as the chart configures it, and the dashboards' queries.

Prometheus is the Debian package on the host; its jobs are the chart's own ``scrapeConfig``
(``helm template``), keeping pods by their ``prometheus.io`` annotations and labelling their series
as the dashboards expect; it reaches each pod on its pod IP over the bridge. One substitution:
Debian builds Prometheus without ``kubernetes_sd``, so the jobs' ``kubernetes_sd_configs`` (role
pod) become an ``http_sd`` endpoint of the test answering what role pod would make of the dev
cluster's pods, listed from its API server on every refresh (``treadle.testing.pod_discovery``);
the chart's ``relabel_configs`` run unchanged.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml

from treadle.dashboards import catalog, model, pictures, tangram
from treadle.devcluster import binaries, kwok
from treadle.testing import pod_discovery, prometheus_server

CHART = Path(__file__).resolve().parents[2] / "charts" / "treadle"
NAMESPACE = "default"
SCRAPE_INTERVAL = "2s"
KUBE_VERSION = "1.34.0"
COMPONENTS = {"scheduler", "placement", "buffer", "env", "reward", "feeder", "pool", "trainer"}
# learn.yaml has one agent (no worker moves between agents) and no external resources: the External
# resources and Multi-agent dashboards are checked in local mode (test_dashboards_prometheus).
DASHBOARDS = [d for d in catalog.ALL if d not in (catalog.MULTI_AGENT, tangram.TANGRAM)]
DATA_TIMEOUT_S = 90.0
"""How long a query may stay empty after a job's first steps: a rate needs two samples in its window."""


def chart_scrape_configs() -> list[dict[str, Any]]:
    """The chart's ``scrapeConfig`` jobs, scraping every few seconds."""
    out = subprocess.run(
        [str(binaries.bin_dir() / "helm"), "template", "treadle", str(CHART), "--namespace", "treadle-system",
         "--kube-version", KUBE_VERSION, "--set", "scrapeConfig.enabled=true",
         "--set", f"scrapeConfig.interval={SCRAPE_INTERVAL}", "--show-only", "templates/scrapeconfig.yaml"],
        check=True, capture_output=True, text=True, timeout=60,
    ).stdout  # fmt: skip
    configmap = yaml.safe_load(out)
    jobs: list[dict[str, Any]] = yaml.safe_load(configmap["data"]["treadle-scrape-configs.yaml"])[
        "scrape_configs"
    ]
    return jobs


@contextlib.contextmanager
def prometheus(cluster: kwok.DevCluster) -> Iterator[prometheus_server.PrometheusServer]:
    """A real Prometheus scraping every pod of ``cluster`` through the chart's scrape configuration."""

    def pods() -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = json.loads(cluster.kubectl("get", "pods", "-A", "-o", "json"))["items"]
        return items

    with pod_discovery.serving(pods) as url:
        jobs = pod_discovery.with_pod_discovery(chart_scrape_configs(), url, refresh=SCRAPE_INTERVAL)
        with prometheus_server.prometheus_server({}, scrape_configs=jobs) as prom:
            yield prom


def scraped(prom: prometheus_server.PrometheusServer, job: str) -> set[str]:
    """The components of ``job`` whose pods Prometheus scrapes now (``up == 1``)."""
    up = prom.query(f'up{{namespace="{NAMESPACE}", job="{job}"}} == 1')
    return {r["metric"].get("component", "") for r in up}


def queries(dashboard: model.Dashboard, job: str) -> list[tuple[str, str]]:
    """(panel title, expression as Grafana sends it with ``job`` selected) of every target."""
    rendered = model.render(dashboard)
    return [
        (p["title"], model.resolve(t["expr"], namespace=NAMESPACE, job=job))
        for p in rendered["panels"]
        for t in p["targets"]
    ]


def without_data(
    prom: prometheus_server.PrometheusServer, todo: set[tuple[str, str, str]], timeout_s: float
) -> set[tuple[str, str, str]]:
    """Of (dashboard, panel, expression), those still returning nothing after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while todo and time.monotonic() < deadline:
        todo = {(d, title, expr) for d, title, expr in todo if not prom.query(expr)}
        if todo:
            time.sleep(3)
    return todo


def assert_data(
    prom: prometheus_server.PrometheusServer, dashboards: list[model.Dashboard], job: str, timeout_s: float
) -> None:
    """Every query of ``dashboards`` returns data for ``job`` within ``timeout_s``."""
    todo = {(d.title, title, expr) for d in dashboards for title, expr in queries(d, job)}
    todo = without_data(prom, todo, timeout_s)
    assert not todo, "queries without data:\n" + "\n".join(f"{d} / {t}: {e}" for d, t, e in sorted(todo))


def assert_every_dashboard_has_data(
    prom: prometheus_server.PrometheusServer, job: str, poll: Callable[..., Any]
) -> None:
    """Every pod of a training ``job`` scraped (by the annotations the operator rendered, vLLM by its
    port), the operator too, and every query of ``DASHBOARDS`` returning data for it; each dashboard's
    variables list the job and its namespace. ``poll``: ``test_learn.poll``."""
    poll(lambda: scraped(prom, job) >= COMPONENTS, f"every component of {job} scraped", 120)
    engines = prom.query(f'up{{job="{job}", component="pool", pool="cpu"}} == 1')
    assert len(engines) == 2, engines  # the agent's metrics port and vLLM's own
    assert prom.query('up{namespace="treadle-system", pod=~".*-operator-.*"} == 1'), "operator not scraped"
    assert_data(prom, DASHBOARDS, job, DATA_TIMEOUT_S)
    for dashboard in DASHBOARDS:
        values = prom.query(f"count by (namespace, {dashboard.job_label}) ({dashboard.variable_metric})")
        listed = {(v["metric"]["namespace"], v["metric"][dashboard.job_label]) for v in values}
        assert (NAMESPACE, job) in listed, (dashboard.title, listed)


def draw_pictures(
    prom: prometheus_server.PrometheusServer, dashboards: list[model.Dashboard], job: str, began: float
) -> None:
    """Pictures of ``dashboards`` for ``job`` since ``began``, when ``pictures.folder()`` names a folder."""
    if folder := pictures.folder():
        for dashboard in dashboards:
            pictures.draw(
                dashboard, prom, variables={"namespace": NAMESPACE, "job": job}, start=began, end=time.time(),
                out=folder, source=f"job {job}, namespace {NAMESPACE}, dev cluster",
            )  # fmt: skip
