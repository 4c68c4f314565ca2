"""The rendered vLLM container tells the weights extension where each agent's versions live, and
placement started from its rendered container loads a moved engine's weights (real vLLM there)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from treadle import auth
from treadle.api import env_vars, v1alpha1
from treadle.operator import config, render
from treadle.operator.render import common as render_common
from treadle.operator.render import pool as render_pool
from treadle.services.placement import __main__ as placement_main
from treadle.weights import layout, loader

EXAMPLES = Path(__file__).parents[3] / "manifests" / "examples"


def job(name: str, **weights: Any) -> v1alpha1.RolloutJob:
    raw = yaml.safe_load((EXAMPLES / name).read_text())
    raw["spec"]["weights"] = {**raw["spec"].get("weights", {}), **weights}
    return v1alpha1.parse_job(raw)


def containers(j: v1alpha1.RolloutJob, name: str) -> dict[str, dict[str, Any]]:
    """The container called ``name`` of every pool's pod, by pool."""
    out = {}
    for child in render.render_children(j, config.OperatorConfig()):
        labels = child["metadata"].get("labels", {})
        if child["kind"] == "Deployment" and labels.get("app.kubernetes.io/component") == "pool":
            pod = child["spec"]["template"]["spec"]
            out[child["metadata"]["name"]] = {
                "container": next(c for c in pod["containers"] if c["name"] == name),
                "volumes": pod["volumes"],
            }
    assert out
    return out


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container["env"]}


def test_each_pools_engine_reads_its_agents_versions_from_the_jobs_mooncake_store() -> None:
    j = job("two-agent-flexmarl.yaml", store="mooncake")
    cfg = config.OperatorConfig()
    pools = {p.name: p.agent for p in j.spec.pools}
    for name, pod in containers(j, "vllm").items():
        env = env_of(pod["container"])
        agent = next(a for p, a in pools.items() if name.endswith(f"-{p}"))
        assert env["TREADLE_WEIGHTS_PREFIX"] == f"{j.namespace}/{j.name}"
        assert env["TREADLE_WEIGHTS_AGENT"] == agent
        assert (env["TREADLE_WEIGHTS_MASTER"], env["TREADLE_WEIGHTS_METADATA"]) == (
            cfg.mooncake_master,
            cfg.mooncake_metadata_url,
        )
        assert "TREADLE_WEIGHTS_DIR" not in env


def test_a_single_agent_job_on_a_local_store_reads_the_jobs_prefix_from_the_nodes_directory(
    tmp_path: Path,
) -> None:
    j = job("math-tool-h20.yaml", store="local", replicas=1)
    for pod in containers(j, "vllm").values():
        env = env_of(pod["container"])
        assert "TREADLE_WEIGHTS_AGENT" not in env and "TREADLE_WEIGHTS_MASTER" not in env
        assert env["TREADLE_WEIGHTS_DIR"] == render_pool.LOCAL_WEIGHTS_DIR
        # Only the job's own directory of the node's store, where the store (rooted above it) keeps
        # the job's prefix: no other job's versions are in reach.
        own = f"{render_pool.LOCAL_WEIGHTS_DIR}/{j.namespace}/{j.name}"
        mounts = {m["name"]: m["mountPath"] for m in pod["container"]["volumeMounts"]}
        assert mounts["weights"] == own
        volume = next(v for v in pod["volumes"] if v["name"] == "weights")
        assert volume["hostPath"]["path"] == own
        # What the extension makes of it (the directory moved to this test's).
        _, prefix = loader.store_from_env(env | {"TREADLE_WEIGHTS_DIR": str(tmp_path)})
        assert prefix == f"{j.namespace}/{j.name}"
        agent = loader.store_from_env(
            env | {"TREADLE_WEIGHTS_DIR": str(tmp_path), "TREADLE_WEIGHTS_AGENT": "a"}
        )
        assert agent[1] == layout.agent_prefix(prefix, "a")


def test_placement_applies_weights_in_a_cluster_and_not_without_a_job(tmp_path: Path) -> None:
    j = job("two-agent-flexmarl.yaml")
    children = render.render_children(j, config.OperatorConfig())
    configmap = next(c for c in children if c["kind"] == "ConfigMap")
    for filename, text in configmap["data"].items():
        (tmp_path / filename).write_text(text)
    container = next(
        c
        for child in children
        if child["kind"] == "Deployment"
        for c in child["spec"]["template"]["spec"]["containers"]
        if c["name"] == "placement"
    )
    env = {e["name"]: e["value"].replace(render_common.CONFIG_MOUNT, str(tmp_path)) for e in container["env"]}
    env[env_vars.TOKEN_FILE] = str(auth.write_token(tmp_path / "auth", "the job's token"))  # its Secret
    assert placement_main.parse_args([], env).apply_weights is True
    assert placement_main.parse_args(["--no-apply-weights"], env).apply_weights is False
    assert placement_main.parse_args(["--apply-weights"], env).apply_weights is True


def test_a_job_recreated_under_its_name_reads_and_publishes_none_of_the_earlier_jobs_versions() -> None:
    """Versions outlive a deleted job (a node's local store, the Mooncake master): the prefix carries
    the job's uid, so the new job's trainer and engines start on an empty prefix."""
    first, again = (job("math-tool-h20.yaml", store="local", replicas=1) for _ in range(2))
    first.metadata["uid"], again.metadata["uid"] = "uid-1", "uid-2"
    prefixes = [
        {env_of(pod["container"])["TREADLE_WEIGHTS_PREFIX"] for pod in containers(j, "vllm").values()}
        for j in (first, again)
    ]
    assert prefixes == [{f"{first.namespace}/{first.name}/uid-1"}, {f"{first.namespace}/{first.name}/uid-2"}]
    # Under the job's own hostPath directory, which the pod mounts (no other job's versions in reach).
    (pod,) = containers(again, "vllm").values()
    (mount,) = [m for m in pod["container"]["volumeMounts"] if m["name"] == "weights"]
    assert f"{render_pool.LOCAL_WEIGHTS_DIR}/{prefixes[1].pop()}".startswith(mount["mountPath"] + "/")
