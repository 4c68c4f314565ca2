"""Node labels, taints and resource names that the operator selects on: the one list of them.

``treadle.operator`` writes them into pod node selectors, tolerations and resource requests and
reads them back from Nodes; ``treadle.devcluster.nodes`` puts them on the fake KWOK nodes. Both sides
name them from here (as ``env_vars`` does for variables), so the production operator needs nothing
from the dev tools. The ``nvidia.com/gpu.*`` names are what the NVIDIA GPU feature discovery puts on
real nodes.
"""

from __future__ import annotations

ACCELERATOR_LABEL = "treadle.dev/accelerator"
"""Accelerator class of a node (``H800``, ``H20``), or ``none`` on CPU nodes."""
POOL_LABEL = "treadle.dev/pool"
GPU_RESOURCE = "nvidia.com/gpu"
GPU_TAINT_KEY = "nvidia.com/gpu"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_COUNT_LABEL = "nvidia.com/gpu.count"
GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"
"""GPU memory in MiB."""
GPU_PRESENT_LABEL = "nvidia.com/gpu.present"
"""``true`` on every GPU node of a cluster running the NVIDIA GPU operator (feature discovery)."""
