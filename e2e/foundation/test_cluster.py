"""The real control plane with fake GPU pools behaves like a GPU cluster to its clients.

Every assertion here is decided by the real kube-scheduler and kube-controller-manager; KWOK only
plays the kubelets.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import TypeVar

import pytest
from kubernetes import client, config

from treadle.api import nodes
from treadle.devcluster import kwok

T = TypeVar("T")
GPU_TOLERATION = client.V1Toleration(key=nodes.GPU_TAINT_KEY, operator="Exists", effect="NoSchedule")


@pytest.fixture(scope="module")
def api(dev_cluster: kwok.DevCluster) -> client.ApiClient:
    return config.new_client_from_config(config_file=str(dev_cluster.kubeconfig))


@pytest.fixture
def namespace(api: client.ApiClient) -> Iterator[str]:
    core = client.CoreV1Api(api)
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    # Pods are refused until the controller-manager has made the namespace's default ServiceAccount.
    wait_for(lambda: core.read_namespaced_service_account("default", name), "default ServiceAccount")
    yield name
    core.delete_namespace(name)
    # Wait until the namespace (and its pods' GPUs) is gone: later e2e tests share the cluster.
    wait_for(
        lambda: not core.list_namespace(field_selector=f"metadata.name={name}").items, "namespace gone", 120
    )


def wait_for(probe: Callable[[], T | None], what: str, timeout: float = 60.0) -> T:
    """Poll ``probe`` until it returns a truthy value; API errors count as 'not yet'."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            if value := probe():
                return value
        except client.ApiException as exc:
            last = exc
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last error: {last})")


def gpu_pod(name: str, gpus: int, accelerator: str | None) -> client.V1Pod:
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, labels={"app": name}),
        spec=client.V1PodSpec(
            node_selector={nodes.ACCELERATOR_LABEL: accelerator} if accelerator else None,
            tolerations=[GPU_TOLERATION],
            containers=[
                client.V1Container(
                    name="vllm",
                    image="vllm/vllm-openai:latest",
                    resources=client.V1ResourceRequirements(limits={nodes.GPU_RESOURCE: str(gpus)}),
                )
            ],
        ),
    )


def test_three_pools_with_gpu_capacity(api: client.ApiClient) -> None:
    items = client.CoreV1Api(api).list_node().items
    by_pool: dict[str, list[client.V1Node]] = {}
    for node in items:
        by_pool.setdefault(node.metadata.labels[nodes.POOL_LABEL], []).append(node)
    assert set(by_pool) == {"h800", "h20", "cpu"}
    for pool, accelerator in (("h800", "H800"), ("h20", "H20")):
        for node in by_pool[pool]:
            assert node.metadata.labels[nodes.ACCELERATOR_LABEL] == accelerator
            assert node.status.allocatable[nodes.GPU_RESOURCE] == "8"
    assert all(nodes.GPU_RESOURCE not in n.status.allocatable for n in by_pool["cpu"])
    ready = [c.status for n in items for c in n.status.conditions if c.type == "Ready"]
    assert ready == ["True"] * len(items)


def test_gpu_pod_with_h20_selector_lands_on_h20_and_runs(api: client.ApiClient, namespace: str) -> None:
    core = client.CoreV1Api(api)
    core.create_namespaced_pod(namespace, gpu_pod("decode-worker", 2, "H20"))
    pod = wait_for(
        lambda: (p := core.read_namespaced_pod("decode-worker", namespace)).status.phase == "Running" and p,
        "pod Running",
    )
    node = core.read_node(pod.spec.node_name)
    assert node.metadata.labels[nodes.ACCELERATOR_LABEL] == "H20"
    assert pod.spec.containers[0].resources.limits[nodes.GPU_RESOURCE] == "2"


def test_pod_asking_more_gpus_than_any_node_stays_pending_with_scheduler_reason(
    api: client.ApiClient, namespace: str
) -> None:
    core = client.CoreV1Api(api)
    core.create_namespaced_pod(namespace, gpu_pod("too-big", 9, None))

    def unschedulable() -> client.V1PodCondition | None:
        conditions = core.read_namespaced_pod("too-big", namespace).status.conditions or []
        return next((c for c in conditions if c.type == "PodScheduled" and c.status == "False"), None)

    condition = wait_for(unschedulable, "PodScheduled=False")
    assert condition.reason == "Unschedulable"
    assert "Insufficient nvidia.com/gpu" in condition.message
    assert core.read_namespaced_pod("too-big", namespace).status.phase == "Pending"
    events = core.list_namespaced_event(namespace, field_selector="involvedObject.name=too-big").items
    assert any(e.reason == "FailedScheduling" for e in events)


def test_deleting_a_deployment_garbage_collects_its_pods(api: client.ApiClient, namespace: str) -> None:
    apps, core = client.AppsV1Api(api), client.CoreV1Api(api)
    template = gpu_pod("env", 1, "H800")
    deployment = client.V1Deployment(
        metadata=client.V1ObjectMeta(name="env"),
        spec=client.V1DeploymentSpec(
            replicas=3,
            selector=client.V1LabelSelector(match_labels={"app": "env"}),
            template=client.V1PodTemplateSpec(metadata=template.metadata, spec=template.spec),
        ),
    )
    apps.create_namespaced_deployment(namespace, deployment)

    def running_pods() -> int:
        pods = core.list_namespaced_pod(namespace, label_selector="app=env").items
        return sum(p.status.phase == "Running" for p in pods)

    assert wait_for(lambda: running_pods() == 3, "3 running pods")
    apps.delete_namespaced_deployment("env", namespace, propagation_policy="Background")
    wait_for(
        lambda: not core.list_namespaced_pod(namespace, label_selector="app=env").items, "pods collected"
    )
    assert client.AppsV1Api(api).list_namespaced_replica_set(namespace).items == []
