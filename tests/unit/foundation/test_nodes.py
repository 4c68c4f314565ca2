"""The fake node pools: labels, taints and GPU capacity the operator and scheduler rely on."""

from __future__ import annotations

import pytest

from treadle.api import nodes as api_nodes
from treadle.devcluster import nodes


def test_gpu_node_carries_accelerator_labels_gpu_capacity_and_taint() -> None:
    pool = nodes.NodePool("h20", 1, "H20", 8, "NVIDIA-H20", 97871)
    node = nodes.render_node(pool, 3)
    assert node["metadata"]["name"] == "h20-3"
    labels = node["metadata"]["labels"]
    assert labels[api_nodes.ACCELERATOR_LABEL] == "H20"
    assert labels[api_nodes.POOL_LABEL] == "h20"
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H20"
    assert labels["nvidia.com/gpu.count"] == "8"
    assert node["status"]["allocatable"][api_nodes.GPU_RESOURCE] == "8"
    assert node["status"]["capacity"] == node["status"]["allocatable"]
    assert node["spec"]["taints"] == [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
    assert node["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake"


def test_cpu_node_has_no_gpu_and_no_taint() -> None:
    node = nodes.render_node(nodes.NodePool("cpu", 1, None, cpu="64", memory="256Gi"), 0)
    assert api_nodes.GPU_RESOURCE not in node["status"]["allocatable"]
    assert node["spec"]["taints"] == []
    assert node["metadata"]["labels"][api_nodes.ACCELERATOR_LABEL] == "none"


def test_default_pools_render_three_pools_in_stable_order() -> None:
    names = [n["metadata"]["name"] for n in nodes.render_pools()]
    assert names == ["h800-0", "h800-1", "h20-0", "h20-1", "cpu-0", "cpu-1"]


@pytest.mark.parametrize(
    ("total", "want"),
    [
        (3, {"h800": 1, "h20": 1, "cpu": 1}),
        (10, {"h800": 4, "h20": 4, "cpu": 2}),
        (200, {"h800": 80, "h20": 80, "cpu": 40}),
    ],
    ids=["minimum", "ten", "benchmark-200"],
)
def test_scaled_pools_split_40_40_20(total: int, want: dict[str, int]) -> None:
    got = {p.name: p.count for p in nodes.scaled_pools(total)}
    assert got == want
    assert sum(got.values()) == total


def test_scaled_pools_rejects_fewer_nodes_than_pools() -> None:
    with pytest.raises(ValueError, match="total_nodes: expected at least 3"):
        nodes.scaled_pools(2)
