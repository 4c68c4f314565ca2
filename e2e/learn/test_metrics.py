"""Issue 17's must-show: a real Prometheus scrapes the pods of a job on the dev cluster through the
chart's scrape configuration, and every query of every dashboard returns data.

Prometheus is the Debian package on the host; its jobs are the chart's own ``scrapeConfig``
(``helm template``), keeping pods by their ``prometheus.io`` annotations and labelling their series
as the dashboards expect; it reaches each pod on its pod IP over the bridge. One substitution:
Debian builds Prometheus without ``kubernetes_sd``, so the jobs' ``kubernetes_sd_configs`` (role
pod) become an ``http_sd`` endpoint of this test answering what role pod would make of the dev
cluster's pods, listed from its API server on every refresh (``treadle.testing.pod_discovery``);
the chart's ``relabel_configs`` run unchanged. The job is ``learn.yaml`` under another name with
rows from a ConfigMap (as ``test_learn``'s), trained a few steps, so trainer, weight sync and every
service have reported.

A second job (``tangram_variant``: the same rows scored by two SIMULATED reward models sharing two of
the GPU node's SIMULATED GPUs, in the reward gateway's pod) feeds the External resources dashboard.
A third (``two_agent_variant``: a planner and an executor of one instance shape, three pods of real
vLLM, each serving two sequences at a time) feeds the Multi-agent dashboard: every turn is the
planner's, so its queue builds and placement moves an executor worker to it.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import test_learn as learn
import yaml

from treadle.dashboards import catalog, model, pictures, tangram
from treadle.devcluster import binaries, kwok
from treadle.testing import pod_discovery, prometheus_server

CHART = Path(__file__).resolve().parents[2] / "charts" / "treadle"
NAME = "learn-metrics"
NAMESPACE = "default"
STEPS = 3
SCRAPE_INTERVAL = "2s"
KUBE_VERSION = "1.34.0"
COMPONENTS = {"scheduler", "placement", "buffer", "env", "reward", "feeder", "pool", "trainer"}
# learn.yaml has one agent (no worker moves between agents) and no external resources: the External
# resources and Multi-agent dashboards have a job each (``tangram_variant``, ``two_agent_variant``).
DASHBOARDS = [d for d in catalog.ALL if d not in (catalog.MULTI_AGENT, tangram.TANGRAM)]
TANGRAM_NAME = "learn-tangram"
TWO_AGENT_NAME = "learn-two-agent"
DATA_TIMEOUT_S = 90.0
"""How long a query may stay empty after training: a rate needs two samples in its window."""


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


@pytest.fixture(scope="module")
def prometheus(cluster: kwok.DevCluster) -> Iterator[prometheus_server.PrometheusServer]:
    def pods() -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = json.loads(cluster.kubectl("get", "pods", "-A", "-o", "json"))["items"]
        return items

    with pod_discovery.serving(pods) as url:
        jobs = pod_discovery.with_pod_discovery(chart_scrape_configs(), url, refresh=SCRAPE_INTERVAL)
        with prometheus_server.prometheus_server({}, scrape_configs=jobs) as prom:
            yield prom


def scraped(prom: prometheus_server.PrometheusServer, job: str = NAME) -> set[str]:
    """The components of ``job`` whose pods Prometheus scrapes now (``up == 1``)."""
    up = prom.query(f'up{{namespace="{NAMESPACE}", job="{job}"}} == 1')
    return {r["metric"].get("component", "") for r in up}


def queries(dashboard: model.Dashboard, job: str = NAME) -> list[tuple[str, str]]:
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


def tangram_variant() -> dict[str, Any]:
    """``learn.yaml``'s rows in two tasks scored by two SIMULATED reward models (``judge:small``,
    ``judge:large``, as ``manifests/local/tangram.yaml``) sharing 2 SIMULATED GPUs: ARL-Tangram's GPU
    actions, restores from host memory and evictions; no trainer (the window fills and admission stops,
    which is enough to read the dashboard)."""
    job = learn.variant(TANGRAM_NAME, learn.CONFIG_MAP, pools=1)
    (task,) = job["spec"]["tasks"]
    job["spec"]["tasks"] = [task | {"name": "small", "reward": "judge:small"},
                            task | {"name": "large", "reward": "judge:large"}]  # fmt: skip
    job["spec"]["externalResources"] = {
        "rewardModelGpus": 2, "rewardModelGpuMemoryGb": 0.1,
        "rewardModels": [{"name": "small", "model": "judge-small", "weightsGb": 0.02},
                         {"name": "large", "model": "judge-large", "weightsGb": 0.1, "parallelism": [1, 2]}],
    }  # fmt: skip
    return job


@pytest.mark.timeout(learn.TRAIN_TIMEOUT_S + 600)
def test_every_dashboard_query_returns_data_from_the_pods_of_a_job(
    cluster: kwok.DevCluster, prometheus: prometheus_server.PrometheusServer
) -> None:
    began = time.time()
    learn.apply(cluster, learn.variant(NAME, learn.CONFIG_MAP))
    learn.train(cluster, NAME, steps=STEPS)
    # Every pod of the job, by the annotations the operator rendered, and vLLM by its port.
    learn.poll(lambda: scraped(prometheus) >= COMPONENTS, f"every component of {NAME} scraped", 120)
    engines = prometheus.query(f'up{{job="{NAME}", component="pool", pool="cpu"}} == 1')
    assert len(engines) == 2, engines  # the agent's metrics port and vLLM's own
    assert prometheus.query('up{namespace="treadle-system", pod=~".*-operator-.*"} == 1'), (
        "operator not scraped"
    )

    assert_data(prometheus, DASHBOARDS, NAME, DATA_TIMEOUT_S)
    # The variables list the job (and its namespace) for every dashboard.
    for dashboard in DASHBOARDS:
        values = prometheus.query(
            f"count by (namespace, {dashboard.job_label}) ({dashboard.variable_metric})"
        )
        assert {(NAMESPACE, NAME)} <= {
            (v["metric"]["namespace"], v["metric"][dashboard.job_label]) for v in values
        }
    draw_pictures(prometheus, DASHBOARDS, NAME, began)
    learn.delete(cluster, NAME)


@pytest.mark.timeout(900)
def test_every_external_resources_query_returns_data_from_a_job_with_reward_models(
    cluster: kwok.DevCluster, prometheus: prometheus_server.PrometheusServer
) -> None:
    """The External resources (ARL-Tangram) dashboard from the pods of ``tangram_variant``: its reward
    gateway's pod holds the 2 GPUs and serves both models, restoring each from host memory on demand."""
    began = time.time()
    learn.apply(cluster, tangram_variant())
    learn.poll(lambda: scraped(prometheus, TANGRAM_NAME) >= {"reward", "pool", "scheduler"},
               f"the pods of {TANGRAM_NAME} scraped", 300)  # fmt: skip
    assert_data(prometheus, [tangram.TANGRAM], TANGRAM_NAME, 300)  # vLLM on CPU starts in 60-100 s
    draw_pictures(prometheus, [tangram.TANGRAM], TANGRAM_NAME, began)
    learn.delete(cluster, TANGRAM_NAME)


def two_agent_variant() -> dict[str, Any]:
    """``learn.yaml``'s rows for a planner (one pod) and an executor (two pods) of one instance shape
    taking turns, no trainer. Every answer ends its trajectory (``maxTurns: 1``), so every turn is the
    planner's: with vLLM serving two sequences at a time its queue builds while the executor's workers
    idle, and placement (polling every 0.5 s) moves one of them to the planner: drained, its engine
    loaded with the planner's version 0 (the checkpoint it started from), re-registered."""
    job = learn.variant(TWO_AGENT_NAME, learn.CONFIG_MAP, pools=1)
    (agent,) = job["spec"]["agents"]
    job["spec"]["agents"] = [agent | {"name": "planner"}, agent | {"name": "executor"}]
    (pool,) = job["spec"]["pools"]
    engine = pool["engine"] | {"args": ["--enforce-eager", "--max-num-seqs", "2"]}
    job["spec"]["pools"] = [
        pool | {"name": "planner", "agent": "planner", "replicas": 1, "engine": engine},
        pool | {"name": "executor", "agent": "executor", "replicas": 2, "engine": engine},
    ]
    job["spec"]["tasks"][0]["agents"] = ["planner", "executor"]
    job["spec"]["rollout"]["rebalance"] = {"intervalSeconds": 0.5}
    return job


@pytest.mark.timeout(900)
def test_every_multi_agent_query_returns_data_from_a_two_agent_job(
    cluster: kwok.DevCluster, prometheus: prometheus_server.PrometheusServer
) -> None:
    """The Multi-agent (FlexMARL) dashboard from the pods of ``two_agent_variant``: placement's queue
    per agent and the workers it moved, scraped from its pod through the chart's configuration."""
    began = time.time()
    learn.apply(cluster, two_agent_variant())
    learn.poll(lambda: scraped(prometheus, TWO_AGENT_NAME) >= {"placement", "pool", "scheduler"},
               f"the pods of {TWO_AGENT_NAME} scraped", 300)  # fmt: skip
    assert_data(prometheus, [catalog.MULTI_AGENT], TWO_AGENT_NAME, 420)  # three vLLM pods on 2 cores
    panels = queries(catalog.MULTI_AGENT, TWO_AGENT_NAME)
    (moved,) = [e for t, e in panels if t.startswith("Workers moved")]
    moves = {(r["metric"]["donor"], r["metric"]["receiver"]) for r in prometheus.query(moved)}
    assert moves == {("executor", "planner")}, moves
    # The planner's queue, served by its own worker and the one it was lent, drains (the window's
    # 64 trajectories; no trainer, so admission then stops).
    (queued,) = [e for t, e in panels if t.startswith("Queued turns")]
    learn.poll(lambda: (now := prometheus.query(queued)) and all(float(r["value"][1]) == 0 for r in now),
               "the planner's queue drained", 300)  # fmt: skip
    draw_pictures(prometheus, [catalog.MULTI_AGENT], TWO_AGENT_NAME, began)
    learn.delete(cluster, TWO_AGENT_NAME)
