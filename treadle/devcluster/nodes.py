"""Pure renderers of the fake node pools: H800 (prefill-heavy), H20 (decode-heavy) and CPU.

Labels follow what the NVIDIA GPU feature discovery puts on real nodes (``nvidia.com/gpu.*``) plus
Treadle's own ``treadle.dev/accelerator`` and ``treadle.dev/pool``, all named in
``treadle.api.nodes``, so the operator's node selectors work unchanged on a real cluster.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from treadle.api import nodes as api_nodes

KWOK_ANNOTATION = "kwok.x-k8s.io/node=fake"
"""The annotation (selector form) of the nodes KWOK manages."""
PROCESS_ANNOTATION = "treadle.dev/node-agent"
"""Set on the process nodes, whose pods the node agent really runs (``treadle.devcluster.nodeagent``)."""


@dataclass(frozen=True)
class NodePool:
    """One homogeneous pool of fake nodes."""

    name: str
    count: int
    accelerator: str | None  # None for the CPU pool
    gpus_per_node: int = 0
    gpu_product: str = ""
    gpu_memory_mib: int = 0
    cpu: str = "128"
    memory: str = "1Ti"


DEFAULT_POOLS: tuple[NodePool, ...] = (
    # H800: compute-optimized, 80 GB HBM3, 989 dense bf16 TFLOP/s (RollArt Table 2).
    NodePool("h800", 2, "H800", 8, "NVIDIA-H800-80GB-HBM3", 81559, cpu="192", memory="2Ti"),
    # H20: bandwidth-optimized, 96 GB HBM3, 148 dense bf16 TFLOP/s (RollArt Table 2).
    NodePool("h20", 2, "H20", 8, "NVIDIA-H20", 97871, cpu="192", memory="2Ti"),
    NodePool("cpu", 2, None, cpu="64", memory="256Gi"),
)


def render_node(pool: NodePool, index: int) -> dict[str, Any]:
    """The Node object for the ``index``-th node of ``pool``."""
    name = f"{pool.name}-{index}"
    kwok_key, kwok_value = KWOK_ANNOTATION.split("=")
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "type": "kwok",
        api_nodes.POOL_LABEL: pool.name,
    }
    resources = {"cpu": pool.cpu, "memory": pool.memory, "pods": "110"}
    taints: list[dict[str, str]] = []
    if pool.accelerator is not None:
        labels |= {
            api_nodes.ACCELERATOR_LABEL: pool.accelerator,
            api_nodes.GPU_PRODUCT_LABEL: pool.gpu_product,
            api_nodes.GPU_COUNT_LABEL: str(pool.gpus_per_node),
            api_nodes.GPU_MEMORY_LABEL: str(pool.gpu_memory_mib),
        }
        resources[api_nodes.GPU_RESOURCE] = str(pool.gpus_per_node)
        taints.append({"key": api_nodes.GPU_TAINT_KEY, "value": "present", "effect": "NoSchedule"})
    else:
        labels[api_nodes.ACCELERATOR_LABEL] = "none"
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": labels,
            # KWOK manages only nodes carrying this annotation.
            "annotations": {kwok_key: kwok_value, "node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {"taints": taints},
        "status": {
            "allocatable": dict(resources),
            "capacity": dict(resources),
            "nodeInfo": {
                "architecture": "amd64",
                "operatingSystem": "linux",
                "kubeletVersion": "fake",
                "kubeProxyVersion": "fake",
            },
            "phase": "Running",
        },
    }


def render_pools(pools: tuple[NodePool, ...] = DEFAULT_POOLS) -> list[dict[str, Any]]:
    """Every Node of every pool, in a stable order."""
    return [render_node(pool, i) for pool in pools for i in range(pool.count)]


def scaled_pools(total_nodes: int) -> tuple[NodePool, ...]:
    """The default pools resized to about ``total_nodes`` nodes (40 % H800, 40 % H20, 20 % CPU)."""
    if total_nodes < 3:
        raise ValueError(f"total_nodes: expected at least 3 (one per pool), got {total_nodes}")
    gpu = max(1, total_nodes * 2 // 5)
    cpu = max(1, total_nodes - 2 * gpu)
    counts = {"h800": gpu, "h20": gpu, "cpu": cpu}
    return tuple(
        NodePool(
            p.name,
            counts[p.name],
            p.accelerator,
            p.gpus_per_node,
            p.gpu_product,
            p.gpu_memory_mib,
            p.cpu,
            p.memory,
        )
        for p in DEFAULT_POOLS
    )
