"""``spec.pools[].engine``: what a pool's engine container gets beyond Treadle's defaults.

Referenced by ``Pool.engine`` in ``treadle.api.v1alpha1`` (so the CRD carries it); rendered by
``treadle.operator.render.pool``. For hardware the defaults do not fit: vLLM's CPU build (the dev
cluster's SIMULATED GPU nodes, ``manifests/dev/learn.yaml``), or a GPU's own tuning flags.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from treadle.api import base


class EnvVar(base.Model):
    """A literal environment variable of the engine container."""

    name: str = Field(min_length=1, max_length=253, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    """Variable name."""
    value: str = Field(default="", max_length=32768)
    """Value."""


class Engine(base.Model):
    """The engine container's extra arguments, environment and resource requests."""

    args: list[Annotated[str, Field(max_length=4096)]] = Field(default_factory=list, max_length=64)
    """vLLM arguments after Treadle's own; a repeated flag takes the last value, so these override."""
    env: list[EnvVar] = Field(default_factory=list, max_length=64)
    """Extra environment variables; one Treadle sets itself (``TREADLE_*``, ``VLLM_SERVER_DEV_MODE``)
    keeps Treadle's value."""
    resources: base.Resources | None = None
    """The engine container's CPU and memory, as on any container (``nvidia.com/gpu`` is the pool's
    ``tensorParallel``, added to both lists); unset: requests 4 CPU and 32Gi per GPU, memory limit
    64Gi per GPU."""
