"""charts/treadle: `helm lint` and `helm template` with the real helm binary, RBAC, values schema.

In the e2e tier because it needs the Kubernetes tool binaries (built once by hack/build-k8s.sh);
it needs no running cluster. The chart is installed for real by the fixtures in conftest.py.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from treadle.api import crd
from treadle.dashboards import __main__ as dashboards_main
from treadle.dashboards import catalog
from treadle.devcluster import binaries
from treadle.operator.render import common as render_common

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "treadle"
KUBE_VERSION = "1.34.0"


def _helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    helm = binaries.bin_dir() / "helm"
    proc = subprocess.run([str(helm), *args], capture_output=True, text=True, timeout=60, check=False)
    if check and proc.returncode != 0:
        raise AssertionError(f"helm {args[0]} failed: {proc.stderr}")
    return proc


def _render(*sets: str) -> list[dict[str, Any]]:
    argv = ["template", "rel", str(CHART), "--namespace", "treadle-system", "--kube-version", KUBE_VERSION]
    for value in sets:
        argv += ["--set", value]
    return [d for d in yaml.safe_load_all(_helm(*argv).stdout) if d]


def _by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def test_helm_lint_strict() -> None:
    out = _helm("lint", str(CHART), "--strict", "--kube-version", KUBE_VERSION).stdout
    assert "0 chart(s) failed" in out


def test_template_renders_the_generated_crd() -> None:
    (rendered,) = _by_kind(_render(), "CustomResourceDefinition")
    expected = crd.render_crd()
    expected["metadata"]["annotations"] = {"helm.sh/resource-policy": "keep"}
    assert rendered == expected


def test_crd_install_can_be_turned_off() -> None:
    assert _by_kind(_render("crds.install=false"), "CustomResourceDefinition") == []


def test_operator_deployment_is_single_replica_recreate_with_probes() -> None:
    (dep,) = [d for d in _by_kind(_render(), "Deployment") if d["metadata"]["name"].endswith("-operator")]
    spec = dep["spec"]
    assert spec["replicas"] == 1 and spec["strategy"] == {"type": "Recreate"}
    (container,) = spec["template"]["spec"]["containers"]
    assert container["command"] == ["treadle", "operator", "run"]
    assert "--namespace=default" in container["args"] and "--all-namespaces" not in container["args"]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    env = {e["name"]: e.get("value") for e in container["env"]}  # secrets come as valueFrom
    assert env["TREADLE_REDIS_URL"] == "redis://rel-treadle-redis.treadle-system.svc:6379/0"
    assert spec["template"]["spec"]["serviceAccountName"] == "rel-treadle-operator"


def test_the_operators_key_and_redis_password_come_from_the_charts_secret() -> None:
    docs = _render()
    (secret,) = _by_kind(docs, "Secret")
    assert secret["metadata"]["name"] == "rel-treadle-auth" and set(secret["data"]) == {
        "auth-key",
        "redis-password",
    }
    pods = _pods()
    (operator,) = pods["rel-treadle-operator"]["containers"]
    refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in operator["env"] if "valueFrom" in e}
    assert refs == {
        "TREADLE_AUTH_KEY": {"name": "rel-treadle-auth", "key": "auth-key"},
        "TREADLE_REDIS_PASSWORD": {"name": "rel-treadle-auth", "key": "redis-password"},
    }
    (redis,) = pods["rel-treadle-redis"]["containers"]
    assert redis["args"][-2:] == ["--requirepass", "$(REDIS_PASSWORD)"]
    assert redis["env"] == [
        {"name": "REDIS_PASSWORD", "valueFrom": {"secretKeyRef": refs["TREADLE_REDIS_PASSWORD"]}}
    ]
    (policy,) = _by_kind(docs, "NetworkPolicy")  # Redis: RolloutJob pods and the operator only
    (rule,) = policy["spec"]["ingress"]
    assert rule["from"][0]["podSelector"] == {
        "matchExpressions": [{"key": "treadle.dev/job", "operator": "Exists"}]
    }
    assert rule["from"][1]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "operator"
    given = _render("auth.key=k", "redis.password=p", "networkPolicy.enabled=false")
    (secret,) = _by_kind(given, "Secret")
    assert secret["data"] == {"auth-key": "aw==", "redis-password": "cA=="} and not _by_kind(
        given, "NetworkPolicy"
    )
    # An external Redis without a password given: no per-job Redis users, no admin password.
    external = _render("redis.enabled=false", "redis.externalUrl=redis://r:6379/0")
    (operator_dep,) = [
        d for d in _by_kind(external, "Deployment") if d["metadata"]["name"].endswith("-operator")
    ]
    names = {e["name"] for e in operator_dep["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert "TREADLE_AUTH_KEY" in names and "TREADLE_REDIS_PASSWORD" not in names


def _pods(*sets: str) -> dict[str, dict[str, Any]]:
    return {
        d["metadata"]["name"]: d["spec"]["template"]["spec"] for d in _by_kind(_render(*sets), "Deployment")
    }


def test_chart_pods_stay_off_gpu_nodes_unless_told_otherwise() -> None:
    """By default the operator, Redis and the Mooncake master avoid GPU nodes by the operator's own rule
    (no label needed on CPU nodes); cpuPlacement changes all three, a component's values replace it."""
    pods = _pods()
    assert set(pods) == {"rel-treadle-operator", "rel-treadle-redis", "rel-treadle-mooncake"}
    for name, pod in pods.items():
        assert pod["affinity"] == render_common.not_on_gpu_nodes(), name
        assert "nodeSelector" not in pod and "tolerations" not in pod, name
    toleration = {"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}
    pods = _pods(
        "cpuPlacement.tolerations[0].key=dedicated", "cpuPlacement.tolerations[0].operator=Exists",
        "cpuPlacement.tolerations[0].effect=NoSchedule", "redis.nodeSelector.disk=ssd",
    )  # fmt: skip
    assert all(pod["tolerations"] == [toleration] for pod in pods.values())
    assert pods["rel-treadle-redis"]["nodeSelector"] == {"disk": "ssd"}
    assert pods["rel-treadle-redis"]["affinity"] == render_common.not_on_gpu_nodes()
    assert "nodeSelector" not in pods["rel-treadle-operator"]
    anywhere = _pods("cpuPlacement.affinity=null")
    assert all("affinity" not in pod for pod in anywhere.values())


def _rules(docs: list[dict[str, Any]], kind: str) -> dict[tuple[str, str], list[str]]:
    out: dict[tuple[str, str], list[str]] = {}
    for role in _by_kind(docs, kind):
        for rule in role["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    out[(group, resource)] = sorted(rule["verbs"])
    return out


def test_rbac_is_least_privilege_and_has_no_wildcards() -> None:
    docs = _render("operator.clusterWide=true")
    rules = _rules(docs, "ClusterRole")
    assert _by_kind(docs, "Role") == []
    assert rules[("", "nodes")] == ["list"]
    assert rules[("treadle.dev", "rolloutjobs/status")] == ["patch"]
    assert rules[("apps", "deployments")] == ["create", "delete", "list", "patch", "watch"]
    assert rules[("", "pods")] == ["list", "watch"]
    assert rules[("", "events")] == ["create"]
    # The per-job scheduler identity (ServiceAccount, Role, RoleBinding), applied like any child.
    for key in (("", "serviceaccounts"), ("rbac.authorization.k8s.io", "roles"),
                ("rbac.authorization.k8s.io", "rolebindings")):  # fmt: skip
        assert rules[key] == ["create", "delete", "list", "patch"], key
    assert rules[("batch", "jobs")] == ["create", "delete", "list", "patch"]  # a job's spec.trainer
    assert ("rbac.authorization.k8s.io", "clusterroles") not in rules
    for (group, resource), verbs in rules.items():
        assert "*" not in verbs and group != "*" and resource != "*"
        assert ("get" not in verbs and "update" not in verbs) or resource == "rolloutjobs/finalizers"
    # The job's Secret (token, Redis password) and NetworkPolicy, applied like any child.
    for key in (("", "secrets"), ("networking.k8s.io", "networkpolicies")):
        assert rules[key] == ["create", "delete", "list", "patch"], key


def test_by_default_the_operator_serves_the_default_namespace_through_a_role() -> None:
    """Least privilege unless asked: the namespaced rules (pods, Secrets, Deployments...) are a Role in
    ``default``; cluster-wide only what must be (Nodes list, and what kopf itself watches)."""
    docs = _render()
    assert [r["metadata"]["namespace"] for r in _by_kind(docs, "Role")] == ["default"]
    wide = _rules(_render("operator.clusterWide=true"), "ClusterRole")
    cluster_scoped = {
        ("", "nodes"), ("", "namespaces"), ("apiextensions.k8s.io", "customresourcedefinitions"),
    }  # fmt: skip
    assert set(_rules(docs, "ClusterRole")) == cluster_scoped
    assert _rules(docs, "Role") == {k: v for k, v in wide.items() if k not in cluster_scoped}


def test_an_operator_watching_no_namespace_is_refused_naming_both_values() -> None:
    argv = ["template", "rel", str(CHART), "--kube-version", KUBE_VERSION,
            "--set-json", "operator.watchNamespaces=[]"]  # fmt: skip
    proc = _helm(*argv, check=False)
    assert proc.returncode != 0 and "operator.watchNamespaces" in proc.stderr, proc.stderr
    assert "operator.clusterWide=true" in proc.stderr


def test_watch_namespaces_get_roles_not_cluster_wide_rules() -> None:
    docs = _render("operator.watchNamespaces={team-a,team-b}")
    assert sorted(r["metadata"]["namespace"] for r in _by_kind(docs, "Role")) == ["team-a", "team-b"]
    cluster = _rules(docs, "ClusterRole")
    assert ("apps", "deployments") not in cluster and ("", "nodes") in cluster
    (dep,) = [d for d in _by_kind(docs, "Deployment") if d["metadata"]["name"].endswith("-operator")]
    args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--namespace=team-a" in args and "--all-namespaces" not in args


def test_service_monitor_toggle() -> None:
    assert _by_kind(_render(), "ServiceMonitor") == []
    (monitor,) = _by_kind(_render("serviceMonitor.enabled=true"), "ServiceMonitor")
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("operator.unknownKey=1", "additional properties 'unknownKey' not allowed"),
        ("operator.metricsPort=70000", "maximum"),
        ("operator.image.pullPolicy=Sometimes", "/operator/image/pullPolicy"),
        ("redis.externalUrl=http://wrong", "/redis/externalUrl"),
    ],
    ids=["unknown-key", "port-range", "pull-policy", "redis-url"],
)
def test_values_schema_rejects_bad_values(value: str, message: str) -> None:
    argv = ["template", "rel", str(CHART), "--kube-version", KUBE_VERSION, "--set", value]
    proc = _helm(*argv, check=False)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr


def test_external_backends_require_their_address() -> None:
    argv = ["template", "rel", str(CHART), "--kube-version", KUBE_VERSION, "--set", "redis.enabled=false"]
    proc = _helm(*argv, check=False)
    assert proc.returncode != 0 and "redis.externalUrl is required" in proc.stderr


def test_every_dashboard_is_a_configmap_for_grafanas_sidecar_holding_the_generated_json() -> None:
    generated = dashboards_main.rendered()
    assert len(generated) == len(catalog.ALL)
    maps = [d for d in _by_kind(_render(), "ConfigMap") if "-dashboard-" in d["metadata"]["name"]]
    assert len(maps) == len(generated)
    held = {}
    for cm in maps:
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        ((name, text),) = cm["data"].items()
        held[name] = text
    assert held == generated
    # The sidecar's label and namespace are the user's to choose; the dashboards can be left out.
    (relabelled, *_) = [
        d
        for d in _by_kind(_render("dashboards.labels.team=ml", "dashboards.namespace=grafana"), "ConfigMap")
        if "-dashboard-" in d["metadata"]["name"]
    ]
    assert relabelled["metadata"]["labels"]["team"] == "ml"
    assert relabelled["metadata"]["namespace"] == "grafana"
    assert not [d for d in _by_kind(_render("dashboards.enabled=false"), "ConfigMap") if "-dashboard-" in
                d["metadata"]["name"]]  # fmt: skip


def test_pod_monitor_toggle_scrapes_every_job_pod_and_vllm() -> None:
    assert _by_kind(_render(), "PodMonitor") == []
    (monitor,) = _by_kind(_render("podMonitor.enabled=true"), "PodMonitor")
    spec = monitor["spec"]
    assert spec["jobLabel"] == render_common.JOB_LABEL
    assert spec["selector"]["matchLabels"]["app.kubernetes.io/managed-by"] == render_common.FIELD_MANAGER
    assert [e["port"] for e in spec["podMetricsEndpoints"]] == ["metrics", "openai"]
    (watched,) = _by_kind(_render("podMonitor.enabled=true", "operator.watchNamespaces={a,b}"), "PodMonitor")
    assert watched["spec"]["namespaceSelector"] == {"matchNames": ["a", "b"]}


def test_scrape_config_toggle_holds_prometheus_scrape_configs() -> None:
    assert not [
        d for d in _by_kind(_render(), "ConfigMap") if d["metadata"]["name"].endswith("scrape-config")
    ]
    (cm,) = [
        d for d in _by_kind(_render("scrapeConfig.enabled=true"), "ConfigMap")
        if d["metadata"]["name"].endswith("scrape-config")
    ]  # fmt: skip
    jobs = yaml.safe_load(cm["data"]["treadle-scrape-configs.yaml"])["scrape_configs"]
    assert [j["job_name"] for j in jobs] == ["treadle", "treadle-engines"]
    # Pods of the jobs' namespaces, and of the release's (the operator's own pod).
    watched = {"role": "pod", "namespaces": {"names": ["default", "treadle-system"]}}
    assert all(j["kubernetes_sd_configs"] == [watched] for j in jobs)
    (cm,) = [
        d for d in _by_kind(_render("scrapeConfig.enabled=true", "operator.clusterWide=true"), "ConfigMap")
        if d["metadata"]["name"].endswith("scrape-config")
    ]  # fmt: skip
    jobs = yaml.safe_load(cm["data"]["treadle-scrape-configs.yaml"])["scrape_configs"]
    assert all(j["kubernetes_sd_configs"] == [{"role": "pod"}] for j in jobs)
    # The operator's pod is scraped by the same annotations as a job's pods.
    (dep,) = [d for d in _by_kind(_render(), "Deployment") if d["metadata"]["name"] == "rel-treadle-operator"]
    annotations = dep["spec"]["template"]["metadata"]["annotations"]
    assert annotations == {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": "9090",
        "prometheus.io/path": "/metrics",
    }


def test_redis_is_durable_by_default() -> None:
    """AOF fsynced every second on a PVC, and a full Redis refuses writes rather than evicting keys."""
    docs = _render()
    redis = next(d for d in _by_kind(docs, "Deployment") if d["metadata"]["name"] == "rel-treadle-redis")
    pod = redis["spec"]["template"]["spec"]
    args = pod["containers"][0]["args"]
    flags = dict(zip(args[::2], args[1::2], strict=True))
    assert flags["--appendonly"] == "yes" and flags["--appendfsync"] == "everysec"
    assert flags["--maxmemory-policy"] == "noeviction" and flags["--maxmemory"] == "3gb"
    assert flags["--dir"] == "/data" and pod["containers"][0]["volumeMounts"] == [
        {"name": "data", "mountPath": "/data"}
    ]
    assert pod["volumes"] == [{"name": "data", "persistentVolumeClaim": {"claimName": "rel-treadle-redis"}}]
    (pvc,) = _by_kind(docs, "PersistentVolumeClaim")
    assert pvc["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert pvc["spec"]["resources"]["requests"]["storage"] == "8Gi"


def test_redis_without_persistence_keeps_its_aof_on_an_empty_dir() -> None:
    docs = _render("redis.persistence.enabled=false", "redis.appendfsync=always")
    redis = next(d for d in _by_kind(docs, "Deployment") if d["metadata"]["name"] == "rel-treadle-redis")
    pod = redis["spec"]["template"]["spec"]
    assert pod["volumes"] == [{"name": "data", "emptyDir": {}}]
    assert "always" in pod["containers"][0]["args"]
    assert not _by_kind(docs, "PersistentVolumeClaim")
