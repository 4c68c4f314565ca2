"""The stand-in for kubernetes_sd role pod: its targets and meta labels, and what it refuses."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from treadle.testing import pod_discovery

META = pod_discovery.META


def pod(ip: str | None, *containers: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "ns", "labels": {"treadle.dev/job": "learn"},
                     "annotations": {"prometheus.io/port": "9090"}},
        "spec": {"containers": list(containers), "nodeName": "n1"},
        "status": {"podIP": ip, "phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
    }  # fmt: skip


def test_a_target_per_declared_port_and_one_per_container_without_any() -> None:
    ports = [{"name": "http", "containerPort": 8000}, {"name": "metrics", "containerPort": 9090}]
    groups = pod_discovery.pod_targets(
        [pod("10.0.0.5", {"name": "env", "ports": ports}, {"name": "side"}), pod(None, {"name": "x"})]
    )
    assert [g["targets"] for g in groups] == [["10.0.0.5:8000"], ["10.0.0.5:9090"], ["10.0.0.5"]]
    metrics = groups[1]["labels"]
    assert metrics[f"{META}pod_container_port_name"] == "metrics"
    assert metrics[f"{META}pod_container_port_number"] == "9090"
    assert metrics[f"{META}pod_label_treadle_dev_job"] == "learn"
    assert metrics[f"{META}pod_annotation_prometheus_io_port"] == "9090"
    assert metrics[f"{META}pod_annotationpresent_prometheus_io_port"] == "true"
    assert metrics[f"{META}namespace"] == "ns" and metrics[f"{META}pod_ready"] == "true"
    assert f"{META}pod_container_port_name" not in groups[2]["labels"]


def test_only_role_pod_is_replaced_and_other_discovery_is_refused() -> None:
    jobs = [{"job_name": "a", "kubernetes_sd_configs": [{"role": "pod"}], "relabel_configs": [{"x": 1}]},
            {"job_name": "b", "static_configs": [{"targets": ["h:1"]}]}]  # fmt: skip
    url = "http://127.0.0.1:1/targets"
    a, b = pod_discovery.with_pod_discovery(jobs, url, refresh="2s")
    assert a == {
        "job_name": "a",
        "relabel_configs": [{"x": 1}],
        "http_sd_configs": [{"url": url, "refresh_interval": "2s"}],
    }
    assert b == jobs[1]
    namespaced = [
        {"job_name": "c", "kubernetes_sd_configs": [{"role": "pod", "namespaces": {"names": ["x", "y"]}}]}
    ]
    (c,) = pod_discovery.with_pod_discovery(namespaced, url, refresh="2s")
    assert c["http_sd_configs"] == [{"url": f"{url}?namespaces=x,y", "refresh_interval": "2s"}]
    for other in ({"role": "node"}, {"role": "pod", "selectors": [{"role": "pod"}]},
                  {"role": "pod", "namespaces": {"names": ["x"], "own_namespace": True}}):  # fmt: skip
        with pytest.raises(ValueError, match="only kubernetes_sd role pod"):
            pod_discovery.with_pod_discovery([{"job_name": "d", "kubernetes_sd_configs": [other]}], url, "2s")


def test_the_endpoint_keeps_only_the_namespaces_a_job_names() -> None:
    pods = [
        {"metadata": {"name": n, "namespace": ns}, "status": {"podIP": f"10.0.0.{i}"},
         "spec": {"containers": [{"name": "c"}]}}
        for i, (n, ns) in enumerate((("p", "default"), ("q", "treadle-system"), ("r", "other")))
    ]  # fmt: skip
    with pod_discovery.serving(lambda: pods) as url:
        every = httpx.get(url, timeout=10).json()
        kept = httpx.get(f"{url}?namespaces=default,treadle-system", timeout=10).json()
    assert len(every) == 3
    assert sorted(g["labels"][f"{META}pod_name"] for g in kept) == ["p", "q"]
