"""The node agent's pure parts: images, DNS records, restart back-off, pod phase, Node object, env."""

from __future__ import annotations

import ipaddress

import dns.message
import dns.rcode
import pytest

from treadle.api import nodes as api_nodes
from treadle.devcluster import nodes
from treadle.devcluster.nodeagent import agent, images, inputs, logs, pod
from treadle.devcluster.nodeagent import dns as cluster_dns

HOST = images.Host(venv_bin="/venv/bin", source_root="/src", system_path="/usr/bin:/bin")


def test_command_replaces_entrypoint_and_cmd_and_args_replace_cmd() -> None:
    operator = "ghcr.io/treadle-dev/treadle-operator:0.1.0"
    assert images.resolve(operator, None, None, HOST).argv == (
        "treadle",
        "operator",
        "run",
        "--all-namespaces",
    )
    assert images.resolve(operator, None, ["version"], HOST).argv == ("treadle", "version")
    assert images.resolve(operator, ["python"], None, HOST).argv == ("python",)
    assert images.resolve("redis:7.4-alpine", None, ["--save", ""], HOST).argv == (
        "redis-server",
        "--save",
        "",
    )


def test_treadle_images_run_the_virtualenv_and_this_checkout() -> None:
    env = images.resolve("vllm/vllm-openai:v0.11.0", None, ["--port", "8080"], HOST).env
    env = {k: v for k, v in env.items() if k != "LD_PRELOAD"}  # vLLM's own (the test below)
    assert env == {"PATH": "/venv/bin:/usr/bin:/bin", "PYTHONPATH": "/src"}
    assert images.resolve("redis@sha256:abc", None, None, HOST).env == {"PATH": "/usr/bin:/bin"}


def test_vllm_images_preload_the_virtualenvs_openmp_runtime() -> None:
    """As vLLM's CPU image does (``LD_PRELOAD``); Treadle's other images do not."""
    env = images.resolve("ghcr.io/treadle-dev/treadle-vllm:0.1.0", None, None, HOST).env
    assert env["LD_PRELOAD"] == "/venv/lib/libiomp5.so"
    services = images.resolve("ghcr.io/treadle-dev/treadle-services:0.1.0", None, None, HOST)
    assert "LD_PRELOAD" not in services.env


def test_unknown_image_is_refused_with_the_image_named() -> None:
    with pytest.raises(images.ImageUnknown, match=r"'busybox:1\.36' has no local runtime"):
        images.resolve("busybox:1.36", ["sh"], None, HOST)


def test_repository_strips_tag_and_digest_but_not_a_registry_port() -> None:
    assert images.repository("localhost:5000/treadle:1") == "localhost:5000/treadle"
    assert images.repository("redis@sha256:abc") == "redis"


def _slice(service: str, *endpoints: tuple[str, bool]) -> dict[str, object]:
    return {
        "metadata": {"namespace": "ns", "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [ip], "conditions": {"ready": ready}} for ip, ready in endpoints],
    }


def test_dns_records_list_only_ready_endpoints_and_known_services_without_any() -> None:
    services = [
        {"metadata": {"name": "web", "namespace": "ns"}},
        {"metadata": {"name": "idle", "namespace": "ns"}},
    ]
    table = cluster_dns.records(services, [_slice("web", ("10.244.0.3", True), ("10.244.0.2", False))])
    assert table == {"web.ns.svc.cluster.local.": ["10.244.0.3"], "idle.ns.svc.cluster.local.": []}


def test_dns_answers_a_records_and_nxdomain_for_unknown_names() -> None:
    table = {"web.ns.svc.cluster.local.": ["10.244.0.3", "10.244.0.4"]}
    reply = cluster_dns.answer(dns.message.make_query("WEB.ns.svc.cluster.local", "A"), table)
    assert sorted(r.address for r in reply.answer[0]) == ["10.244.0.3", "10.244.0.4"]
    assert cluster_dns.answer(dns.message.make_query("web.ns.svc.cluster.local", "AAAA"), table).answer == []
    missing = cluster_dns.answer(dns.message.make_query("example.com", "A"), table)
    assert missing.rcode() == dns.rcode.NXDOMAIN


def test_backoff_restarts_at_once_then_doubles_to_the_cap() -> None:
    assert [pod.backoff(n, 10.0, 300.0) for n in range(7)] == [0.0, 10.0, 20.0, 40.0, 80.0, 160.0, 300.0]


def _container(state: dict[str, object], *, done: bool = False, restarts: int = 0) -> pod.Container:
    return pod.Container(spec={"name": "c"}, state=state, done=done, restart_count=restarts)


def test_phase_follows_init_containers_then_containers() -> None:
    running = _container({"running": {}})
    ok = _container({"terminated": {"exitCode": 0}}, done=True)
    failed = _container({"terminated": {"exitCode": 1}}, done=True)
    waiting = _container({"waiting": {"reason": "ContainerCreating"}})
    assert pod.phase([waiting], [waiting], "Always") == "Pending"
    assert pod.phase([failed], [waiting], "Never") == "Failed"
    assert pod.phase([ok], [running], "Always") == "Running"
    assert pod.phase([], [ok, running], "Always") == "Running"
    assert pod.phase([], [ok, ok], "Never") == "Succeeded"
    assert pod.phase([], [ok, failed], "OnFailure") == "Failed"
    crash_looping = _container({"waiting": {"reason": "CrashLoopBackOff"}}, restarts=3)
    assert pod.phase([], [crash_looping], "Always") == "Running"


def test_cpu_process_node_has_only_the_labels_every_node_has() -> None:
    node = agent.render_node(agent.NodeSpec(name="treadle-run-0"), "10.244.0.1")
    assert node["metadata"]["labels"] == {
        "kubernetes.io/hostname": "treadle-run-0", "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
    }  # fmt: skip
    assert node["metadata"]["annotations"][nodes.PROCESS_ANNOTATION] == "process"
    assert nodes.KWOK_ANNOTATION.split("=")[0] not in node["metadata"]["annotations"]
    assert node["spec"]["taints"] == []
    assert {c["type"]: c["status"] for c in node["status"]["conditions"]}["Ready"] == "True"
    assert node["status"]["addresses"][0] == {"type": "InternalIP", "address": "10.244.0.1"}


def test_gpu_process_node_is_marked_simulated_and_looks_like_its_kwok_pool() -> None:
    node = agent.render_node(agent.NodeSpec(name="g", accelerator="H20", gpus=2), "10.244.0.1")
    labels = node["metadata"]["labels"]
    assert labels[api_nodes.ACCELERATOR_LABEL] == "H20" and labels["nvidia.com/gpu.product"] == "NVIDIA-H20"
    assert node["status"]["capacity"][api_nodes.GPU_RESOURCE] == "2"
    assert node["metadata"]["annotations"][agent.SIMULATED_ANNOTATION] == "true"
    assert node["spec"]["taints"][0]["key"] == api_nodes.GPU_TAINT_KEY


def test_ip_pool_skips_the_gateway_and_reuses_returned_addresses() -> None:
    ips = agent.IPPool(ipaddress.IPv4Network("10.244.7.0/29"))
    first = ips.take("a")
    assert first == ipaddress.IPv4Address("10.244.7.2") and ips.take("a") == first
    ips.give_back("a")
    assert ipaddress.IPv4Address("10.244.7.2") in ips.free


def test_env_expansion_and_downward_fields() -> None:
    assert inputs.expand("$(A)-$(B)-$$(A)", {"A": "x"}) == "x-$(B)-$(A)"
    p = {"metadata": {"name": "n", "namespace": "ns", "uid": "u", "labels": {"app": "web"}},
         "spec": {"nodeName": "treadle-run-0"}, "status": {"podIP": "10.244.0.9"}}  # fmt: skip
    assert inputs.field_value(p, "status.podIP") == "10.244.0.9"
    assert inputs.field_value(p, "metadata.labels['app']") == "web"
    with pytest.raises(inputs.InputError, match=r"status\.podIPs"):
        inputs.field_value(p, "status.podIPs")


def test_api_port_comes_from_the_kubeconfig() -> None:
    assert agent.api_port({"clusters": [{"cluster": {"server": "https://127.0.0.1:32764"}}]}) == 32764


def test_log_tail_keeps_the_last_lines() -> None:
    data = b"a\nb\nc\n"
    assert logs.tail_lines(data, None) == data
    assert logs.tail_lines(data, 2) == b"b\nc\n"
    assert logs.tail_lines(data, 0) == b""
