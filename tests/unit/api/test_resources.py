"""``resources`` in the RolloutJob: Kubernetes' ResourceRequirements, written as on any container."""

from __future__ import annotations

from typing import Any

import api_specs
import pytest
from kubernetes.utils import parse_quantity

from treadle import errors
from treadle.api import base, v1alpha1


@pytest.mark.parametrize(
    "raw", ["1", "500m", "1.5", ".5", "2Gi", "512Mi", "4G", "100k", "3Ki", "1e3", "1E", "7n"]
)
def test_quantity_value_equals_the_kubernetes_clients(raw: str) -> None:
    assert base.quantity_value(raw) == parse_quantity(raw)  # type: ignore[no-untyped-call]


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"environment": {"resources": {"requests": {"memory": "4Gi"}, "limits": {"memory": "4000Mi"}}}},
         "spec.environment.resources"),
        ({"feeder": {"resources": {"requests": {"cpu": "1"}, "limits": {"cpu": "999m"}}}},
         "spec.feeder.resources"),
        ({"trainer": {"resources": {"requests": {"cpu": "2"}, "limits": {"cpu": "1"}}}},
         "spec.trainer.resources"),
        ({"pools": [{"name": "p", "agent": "a", "accelerator": "H20",
                     "engine": {"resources": {"requests": {"memory": "2Gi"}, "limits": {"memory": "1Gi"}}}}]},
         "spec.pools.engine.resources"),
    ],
    ids=["environment", "feeder", "trainer", "engine"],
)  # fmt: skip
def test_a_limit_below_its_request_is_refused_naming_the_field(extra: dict[str, Any], field: str) -> None:
    with pytest.raises(errors.SpecError) as info:
        v1alpha1.parse_spec(api_specs.minimal(**extra))
    assert info.value.field == field and "below its request" in str(info.value)


def test_equal_limits_and_requests_and_one_sided_lists_are_accepted() -> None:
    spec = v1alpha1.parse_spec(
        api_specs.minimal(
            environment={
                "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "1024Mi"}}
            }
        )
    )
    assert spec.environment.resources.rendered() == {
        "requests": {"cpu": "1", "memory": "1Gi"},
        "limits": {"memory": "1024Mi"},
    }


def test_gpus_are_not_a_resource_the_spec_sets() -> None:
    pools = [
        {
            "name": "p",
            "agent": "a",
            "accelerator": "H20",
            "engine": {"resources": {"limits": {"nvidia.com/gpu": "1"}}},
        }
    ]
    with pytest.raises(errors.SpecError) as info:
        v1alpha1.parse_spec(api_specs.minimal(pools=pools))
    assert info.value.field.startswith("spec.pools[0].engine.resources.limits"), info.value.field


def test_unset_resources_are_the_documented_defaults() -> None:
    spec = v1alpha1.parse_spec(api_specs.minimal(trainer={}))
    assert spec.environment.resources.rendered() == {
        "requests": {"cpu": "2", "memory": "4Gi"},
        "limits": {"cpu": "2", "memory": "4Gi"},
    }
    assert spec.feeder.resources.rendered() == {
        "requests": {"cpu": "500m", "memory": "2Gi"},
        "limits": {"memory": "2Gi"},
    }
    assert spec.trainer is not None and spec.trainer.resources.rendered(**{"nvidia.com/gpu": "1"}) == {
        "requests": {"cpu": "2", "memory": "8Gi", "nvidia.com/gpu": "1"},
        "limits": {"cpu": "2", "memory": "8Gi", "nvidia.com/gpu": "1"},
    }
