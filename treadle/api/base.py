"""The wire conventions and the Kubernetes-shaped types every part of the RolloutJob spec shares.

``treadle.api.v1alpha1`` (the job) and ``treadle.api.trainer`` (``spec.trainer``) build on them; they
live apart from ``v1alpha1`` so that a part of the spec in its own module can use them without an
import cycle (``v1alpha1`` imports the parts).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

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
