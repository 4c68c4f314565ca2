"""The RolloutJob API: typed models that are the one source of the CRD schema and of validation.

``v1alpha1`` holds the models and ``parse_spec`` / ``parse_job``; ``crd`` generates the CRD from them.
"""

from treadle.api.v1alpha1 import (
    API_VERSION,
    GROUP,
    KIND,
    PLURAL,
    VERSION,
    RolloutJob,
    RolloutJobSpec,
    RolloutJobStatus,
    parse_job,
    parse_spec,
)

__all__ = [
    "API_VERSION",
    "GROUP",
    "KIND",
    "PLURAL",
    "VERSION",
    "RolloutJob",
    "RolloutJobSpec",
    "RolloutJobStatus",
    "parse_job",
    "parse_spec",
]
