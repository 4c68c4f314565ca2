"""The job's Secret (token, Redis password), its mounts and its NetworkPolicy, as the operator renders."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from treadle import auth, cli
from treadle.api import env_vars, v1alpha1
from treadle.operator import config, render
from treadle.operator.render import common as render_common

EXAMPLES = sorted((Path(__file__).parents[3] / "manifests" / "examples").glob("*.yaml"))
CFG = config.OperatorConfig(auth_key="the operator's key", redis_password="the chart's Redis admin password")


def job(path: Path, uid: str = "uid-1") -> v1alpha1.RolloutJob:
    raw = yaml.safe_load(path.read_text())
    raw["metadata"] |= {"namespace": "team-a", "uid": uid}
    return v1alpha1.parse_job(raw)


def kind(children: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [c for c in children if c["kind"] == name]


def pod_templates(children: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [c["spec"]["template"]["spec"] for c in children if c["kind"] in ("Deployment", "Job")]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_every_treadle_container_mounts_the_jobs_secret_where_its_variables_point(path: Path) -> None:
    j = job(path)
    children = render.render_children(j, CFG)
    (secret,) = kind(children, "Secret")
    assert secret["metadata"]["name"] == f"{j.name}-auth"
    assert secret["metadata"]["ownerReferences"][0]["uid"] == "uid-1"  # deleted with the job
    assert set(secret["stringData"]) == {auth.TOKEN_KEY, auth.REDIS_PASSWORD_KEY}
    seen = 0
    for pod in pod_templates(children):
        volumes = {v["name"]: v for v in pod["volumes"]}
        for container in pod["containers"]:
            env = {e["name"]: e.get("value") for e in container.get("env", ())}
            if env_vars.JOB not in env:
                continue  # not a Treadle container
            seen += 1
            mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
            mount = mounts[render_common.AUTH_MOUNT]
            assert mount["readOnly"] is True
            assert volumes[mount["name"]]["secret"]["secretName"] == secret["metadata"]["name"]
            assert env[env_vars.TOKEN_FILE] == f"{render_common.AUTH_MOUNT}/{auth.TOKEN_KEY}"
            assert (
                env[env_vars.REDIS_PASSWORD_FILE] == f"{render_common.AUTH_MOUNT}/{auth.REDIS_PASSWORD_KEY}"
            )
    assert seen >= 6  # scheduler, placement, buffer, env, reward, each pool's agent and engine
    # A Redis without per-job users (no admin password given to the operator): no Redis login.
    for pod in pod_templates(render.render_children(j, config.OperatorConfig(auth_key="k"))):
        for container in pod["containers"]:
            assert env_vars.REDIS_PASSWORD_FILE not in {e["name"] for e in container.get("env", ())}


def test_tokens_differ_per_job_and_per_operator_key_and_stay_put_across_renders() -> None:
    path = EXAMPLES[0]

    def token(j: v1alpha1.RolloutJob, cfg: config.OperatorConfig) -> str:
        (secret,) = kind(render.render_children(j, cfg), "Secret")
        return str(secret["stringData"][auth.TOKEN_KEY])

    first = token(job(path), CFG)
    assert token(job(path), CFG) == first  # re-rendering (every reconcile) keeps it
    assert token(job(path, uid="uid-2"), CFG) != first  # a job re-created under the same name
    assert token(job(path), config.OperatorConfig(auth_key="another key")) != first
    (secret,) = kind(render.render_children(job(path), CFG), "Secret")
    assert secret["stringData"][auth.REDIS_PASSWORD_KEY] != first
    assert len(first) == 64 and int(first, 16) >= 0


def test_the_network_policy_lets_in_only_the_jobs_own_pods_and_prometheus_on_metrics_ports() -> None:
    j = job(EXAMPLES[0])
    (policy,) = kind(render.render_children(j, CFG), "NetworkPolicy")
    own = {"matchLabels": {render_common.JOB_LABEL: j.name}}
    only_own = [{"from": [{"podSelector": own}]}]
    assert policy["spec"] == {"podSelector": own, "policyTypes": ["Ingress"], "ingress": only_own}
    # Every pod of the job carries the label the policy selects (and lets in).
    for pod in kind(render.render_children(j, CFG), "Deployment"):
        assert pod["spec"]["template"]["metadata"]["labels"][render_common.JOB_LABEL] == j.name

    watched = config.OperatorConfig(auth_key="k", metrics_namespaces=("monitoring",))
    (policy,) = kind(render.render_children(j, watched), "NetworkPolicy")
    _, metrics = policy["spec"]["ingress"]
    assert metrics["from"][0]["namespaceSelector"]["matchExpressions"][0]["values"] == ["monitoring"]
    ports = {p["port"] for p in metrics["ports"]}
    assert ports == {config.PORTS[c] for c in ("metrics", "vllm")}  # every pod's metrics port, vLLM's API
    assert not ports & {config.PORTS[c] for c in render_common.COORDINATION}  # gRPC: the job's pods only


def test_the_operator_refuses_to_start_without_its_key(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("TREADLE_AUTH_KEY", raising=False)
    assert cli.main(["operator", "run", "--namespace", "team-a"]) == 2
    assert "TREADLE_AUTH_KEY is not set" in capsys.readouterr().err
