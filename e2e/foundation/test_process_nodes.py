"""Pods on the dev cluster's process node really run: processes, Service DNS, probes, volumes, deletion.

Everything is decided by the real control plane (scheduler, EndpointSlice controller, API server)
from what the node agent reports; the containers are real processes started from the pod objects.
"""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config
from test_cluster import wait_for
from test_cluster_lifecycle import pids_with

from treadle.devcluster import binaries, kwok

ROOT = Path(__file__).resolve().parents[2]
NODE = "treadle-run-0"
IMAGE = "ghcr.io/treadle-dev/treadle-services:0.1.0"


@pytest.fixture(scope="module")
def core(run_cluster: kwok.DevCluster) -> client.CoreV1Api:
    return client.CoreV1Api(config.new_client_from_config(config_file=str(run_cluster.kubeconfig)))


@pytest.fixture
def ns(core: client.CoreV1Api) -> Iterator[str]:
    name = f"run-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": name}})
    wait_for(lambda: core.read_namespaced_service_account("default", name), "default ServiceAccount")
    yield name
    # Pods first, and wait only for them (their processes): the namespace itself goes in the background.
    core.delete_collection_namespaced_pod(name)
    wait_for(lambda: not core.list_namespaced_pod(name).items, "pods gone", 30)
    core.delete_namespace(name)


def pod(name: str, command: list[str], **spec: Any) -> dict[str, Any]:
    """A pod of one container pinned to the process node; ``spec`` keys go to the container
    (``readinessProbe``, ...) or, for ``volumes`` / ``restartPolicy`` / grace, to the pod."""
    pod_keys = {"volumes", "restartPolicy", "terminationGracePeriodSeconds"}
    container = {"name": "main", "image": spec.pop("image", IMAGE), "command": command}
    container |= {k: v for k, v in spec.items() if k not in pod_keys}
    return {
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {"nodeSelector": {"kubernetes.io/hostname": NODE}, "containers": [container],
                 **{k: v for k, v in spec.items() if k in pod_keys}},
    }  # fmt: skip


def service(name: str, port: int) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"selector": {"app": name}, "ports": [{"port": port}]}}


def http_server(directory: str) -> list[str]:
    return ["python", "-m", "http.server", "8000", "--directory", directory]


def status(core: client.CoreV1Api, ns: str, name: str) -> client.V1PodStatus:
    return core.read_namespaced_pod(name, ns).status


def test_pod_reaches_a_service_by_dns_name_and_reads_a_configmap_volume(
    core: client.CoreV1Api, ns: str
) -> None:
    core.create_namespaced_config_map(ns, {"metadata": {"name": "site"}, "data": {"greeting.txt": "hello"}})
    volume = {"volumes": [{"name": "site", "configMap": {"name": "site"}}],
              "volumeMounts": [{"name": "site", "mountPath": "/srv/site", "readOnly": True}]}  # fmt: skip
    ready = {"httpGet": {"path": "/greeting.txt", "port": 8000}, "periodSeconds": 1}
    # Two pods bind the same port: each has a network namespace of its own.
    for name in ("web", "web-twin"):
        core.create_namespaced_pod(ns, pod(name, http_server("/srv/site"), readinessProbe=ready, **volume))
    core.create_namespaced_service(ns, service("web", 8000))
    fetch = (
        "import sys, time, urllib.request\n"
        "for _ in range(60):\n"
        "    try:\n"
        "        body = urllib.request.urlopen('http://web:8000/greeting.txt', timeout=2).read()\n"
        "        print('fetched', body)\n"
        "        sys.exit(0 if body == b'hello' else 3)\n"
        "    except OSError:\n"
        "        time.sleep(0.5)\n"
        "sys.exit(4)\n"
    )
    core.create_namespaced_pod(ns, pod("client", ["python", "-c", fetch], restartPolicy="Never"))

    done = wait_for(
        lambda: (s := status(core, ns, "client")).phase in ("Succeeded", "Failed") and s, "client done"
    )
    terminated = done.container_statuses[0].state.terminated
    assert (done.phase, terminated.exit_code, terminated.reason) == ("Succeeded", 0, "Completed")
    # kubectl logs: the API server proxies to the agent's log endpoint.
    assert core.read_namespaced_pod_log("client", ns) == "fetched b'hello'\n"
    for name in ("web", "web-twin"):
        s = wait_for(
            lambda n=name: (s := status(core, ns, n)).container_statuses[0].ready and s, f"{name} ready"
        )
        assert s.phase == "Running" and s.pod_ip.startswith("10.244.")
    assert status(core, ns, "web").pod_ip != status(core, ns, "web-twin").pod_ip


def _endpoint_ready(core: client.CoreV1Api, ns: str, service_name: str) -> bool | None:
    """The readiness the EndpointSlice controller publishes for the service's one endpoint."""
    discovery = client.DiscoveryV1Api(core.api_client)
    slices = discovery.list_namespaced_endpoint_slice(
        ns, label_selector=f"kubernetes.io/service-name={service_name}"
    )
    endpoints = [e for s in slices.items for e in (s.endpoints or [])]
    return endpoints[0].conditions.ready if endpoints else None


def test_readiness_probe_gates_the_endpointslice(core: client.CoreV1Api, ns: str) -> None:
    core.create_namespaced_config_map(ns, {"metadata": {"name": "gate"}, "data": {"ready": "no"}})
    check = "import sys; sys.exit(open('/gate/ready').read() != 'yes')"
    probe = {"exec": {"command": ["python", "-c", check]}, "periodSeconds": 1}
    core.create_namespaced_pod(ns, pod(
        "gated", http_server("/"), readinessProbe=probe,
        volumes=[{"name": "gate", "configMap": {"name": "gate"}}],
        volumeMounts=[{"name": "gate", "mountPath": "/gate"}],
    ))  # fmt: skip
    core.create_namespaced_service(ns, service("gated", 8000))
    wait_for(lambda: status(core, ns, "gated").phase == "Running", "gated Running")
    assert wait_for(lambda: _endpoint_ready(core, ns, "gated") is False, "endpoint published not ready")
    assert not status(core, ns, "gated").container_statuses[0].ready

    # The agent rewrites configMap volumes (every 5 s); the exec probe then passes.
    core.patch_namespaced_config_map("gate", ns, {"data": {"ready": "yes"}})
    wait_for(lambda: _endpoint_ready(core, ns, "gated"), "endpoint ready", timeout=30)
    conditions = {c.type: c.status for c in status(core, ns, "gated").conditions}
    assert conditions["Ready"] == conditions["ContainersReady"] == "True"


def test_liveness_failure_restarts_the_container(core: client.CoreV1Api, ns: str) -> None:
    # Nothing listens on 8001: the liveness probe fails twice, the agent kills and restarts.
    liveness = {"tcpSocket": {"port": 8001}, "periodSeconds": 1, "failureThreshold": 2}
    core.create_namespaced_pod(ns, pod("flaky", http_server("/"), livenessProbe=liveness,
                                       terminationGracePeriodSeconds=2))  # fmt: skip
    s = wait_for(lambda: (s := status(core, ns, "flaky")).container_statuses and
                 s.container_statuses[0].restart_count >= 1 and s, "a restart", timeout=30)  # fmt: skip
    last = s.container_statuses[0].last_state.terminated
    assert last is not None and last.exit_code == 128 + 15  # SIGTERM from the agent
    events = core.list_namespaced_event(ns, field_selector="involvedObject.name=flaky").items
    assert {"Unhealthy", "Killing"} <= {e.reason for e in events}


def test_deleting_a_pod_kills_all_its_processes(core: client.CoreV1Api, ns: str) -> None:
    marker = f"treadle-e2e-{uuid.uuid4().hex}"
    # The child leaves the process group and ignores SIGTERM: only the namespace sweep finds it.
    script = (
        "import subprocess, sys, time\n"
        "child = 'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)'\n"
        "subprocess.Popen([sys.executable, '-c', child, sys.argv[1]], start_new_session=True)\n"
        "time.sleep(600)\n"
    )
    core.create_namespaced_pod(ns, pod("sleeper", ["python", "-c", script, marker],
                                       terminationGracePeriodSeconds=1))  # fmt: skip
    wait_for(lambda: len(pids_with(marker)) == 2, "parent and child running")
    core.delete_namespaced_pod("sleeper", ns)
    wait_for(lambda: not core.list_namespaced_pod(ns).items, "pod object removed by the agent", timeout=20)
    assert pids_with(marker) == []


def test_unknown_image_is_a_waiting_reason_not_a_crash(core: client.CoreV1Api, ns: str) -> None:
    core.create_namespaced_pod(ns, pod("odd", ["true"], image="docker.io/library/busybox:1.36"))

    def waiting() -> client.V1ContainerStateWaiting | None:
        statuses = status(core, ns, "odd").container_statuses or []
        return (
            statuses[0].state.waiting
            if statuses and statuses[0].state.waiting.reason != "ContainerCreating"
            else None
        )

    state = wait_for(waiting, "waiting reason")
    assert state.reason == "ErrImageNeverPull" and "busybox" in state.message
    assert status(core, ns, "odd").phase == "Pending"


def test_the_chart_and_a_jobs_coordination_pods_run(
    run_cluster: kwok.DevCluster, core: client.CoreV1Api
) -> None:
    """``helm install``: Redis, the Mooncake master and the operator run as the chart deploys them; the
    operator (in-cluster credentials through the agent's API relay) renders a job whose scheduler,
    placement and buffer pods pass their gRPC readiness probes against the chart's Redis."""
    helm = binaries.bin_dir() / "helm"
    core.create_namespace({"metadata": {"name": "jobs"}})  # first: the chart puts the operator's Role there
    subprocess.run(
        [str(helm), "install", "treadle", str(ROOT / "charts" / "treadle"), "--namespace", "treadle-system",
         "--create-namespace", "--wait", "--timeout", "60s", "--kubeconfig", str(run_cluster.kubeconfig),
         "--set", "redis.persistence.enabled=false",  # no volume provisioner on the dev cluster
         "--set", "operator.watchNamespaces={jobs}"],
        check=True, capture_output=True, timeout=90,
    )  # fmt: skip
    system = core.list_namespaced_pod("treadle-system").items
    assert len(system) == 3 and all(p.status.phase == "Running" and p.spec.node_name == NODE for p in system)
    run_cluster.kubectl(
        "apply", "-n", "jobs", "-f", str(ROOT / "manifests" / "examples" / "math-tool-h20.yaml")
    )

    def coordination_ready() -> bool:
        pods = core.list_namespaced_pod("jobs").items
        statuses = {
            p.metadata.labels.get("app.kubernetes.io/component"): p.status.container_statuses for p in pods
        }
        ready = {component for component, cs in statuses.items() if cs and all(c.ready for c in cs)}
        return {"scheduler", "placement", "buffer"} <= ready

    wait_for(coordination_ready, "scheduler, placement and buffer ready", timeout=60)
    operator = next(p for p in system if "operator" in p.metadata.name)
    assert status(core, "treadle-system", operator.metadata.name).container_statuses[0].restart_count == 0


def test_init_containers_run_in_order_before_the_container(core: client.CoreV1Api, ns: str) -> None:
    def step(name: str, script: str) -> dict[str, Any]:
        return {"name": name, "image": IMAGE, "command": ["python", "-c", script],
                "volumeMounts": [{"name": "work", "mountPath": "/work"}]}  # fmt: skip

    main = step("main", "print(open('/work/order').read())")
    spec = pod("ordered", main["command"], restartPolicy="Never", volumeMounts=main["volumeMounts"],
               volumes=[{"name": "work", "emptyDir": {}}])  # fmt: skip
    spec["spec"]["initContainers"] = [
        step("first", "open('/work/order', 'w').write('1')"),
        step("second", "open('/work/order', 'a').write('2')"),
    ]
    core.create_namespaced_pod(ns, spec)
    done = wait_for(lambda: (s := status(core, ns, "ordered")).phase in ("Succeeded", "Failed") and s, "done")
    assert done.phase == "Succeeded"
    assert [c.state.terminated.exit_code for c in done.init_container_statuses] == [0, 0]
    assert core.read_namespaced_pod_log("ordered", ns) == "12\n"
