"""``spec.trainer``'s group shape: ``replicas`` pods of ``processesPerPod`` ranks, one rank per GPU."""

from __future__ import annotations

from typing import Any

import pytest

from treadle import errors
from treadle.api import crd, v1alpha1
from treadle.api import trainer as trainer_api

SPEC: dict[str, Any] = {
    "agents": [{"name": "a", "model": "Qwen/Qwen3-8B"}],
    "pools": [{"name": "p", "agent": "a", "accelerator": "H20"}],
    "tasks": [{"name": "t", "agents": ["a"], "environment": "math-tool", "reward": "math"}],
}


def spec(**trainer: Any) -> v1alpha1.RolloutJobSpec:
    return v1alpha1.parse_spec({**SPEC, "trainer": trainer})


@pytest.mark.parametrize(
    ("trainer", "processes", "world"),
    [
        ({}, 1, 1),  # CPU, one rank: no torchrun
        ({"gpus": 1}, 1, 1),
        ({"gpus": 4}, 4, 4),  # one rank per GPU
        ({"gpus": 4, "replicas": 2}, 4, 8),
        ({"gpus": 2, "processesPerPod": 2}, 2, 2),
        ({"processesPerPod": 3, "replicas": 2}, 3, 6),  # CPU ranks
    ],
)
def test_processes_per_pod_follows_gpus_unless_set(
    trainer: dict[str, Any], processes: int, world: int
) -> None:
    t = spec(**trainer).trainer
    assert t is not None
    assert (t.processes, t.world_size, t.distributed) == (processes, world, world > 1)


def test_processes_per_pod_other_than_gpus_is_refused_naming_the_field() -> None:
    with pytest.raises(errors.SpecError) as caught:
        spec(gpus=2, processesPerPod=4)
    assert caught.value.field == "spec.trainer.processesPerPod"
    assert str(caught.value).startswith(
        "spec.trainer.processesPerPod: spec.trainer.processesPerPod must equal spec.trainer.gpus"
    )
    assert "(processesPerPod 4, gpus 2)" in str(caught.value)


@pytest.mark.parametrize(
    ("field", "value"),
    [("replicas", 0), ("replicas", trainer_api.MAX_REPLICAS + 1), ("processesPerPod", 0),
     ("processesPerPod", trainer_api.MAX_PROCESSES_PER_POD + 1)],
)  # fmt: skip
def test_group_bounds(field: str, value: int) -> None:
    with pytest.raises(errors.SpecError) as caught:
        spec(**{field: value})
    assert caught.value.field == f"spec.trainer.{field}"


def test_the_crd_carries_the_group_fields_with_their_bounds() -> None:
    props = crd.spec_schema()["properties"]["trainer"]["properties"]
    assert props["replicas"] | {"description": ""} == {
        "type": "integer", "default": 1, "minimum": 1, "maximum": trainer_api.MAX_REPLICAS, "description": "",
    }  # fmt: skip
    assert "default" not in props["processesPerPod"]  # unset: it follows gpus
    assert (props["processesPerPod"]["minimum"], props["processesPerPod"]["maximum"]) == (1, 64)


def test_status_trainer_round_trips_camel_case() -> None:
    raw = {"trainer": {"job": "j-trainer-0123abcd", "pods": 2, "ready": 1, "succeeded": 0, "restarts": 3}}
    st = v1alpha1.RolloutJobStatus.model_validate(raw)
    assert st.trainer == v1alpha1.TrainerStatus(job="j-trainer-0123abcd", pods=2, ready=1, restarts=3)
    assert st.model_dump(mode="json", by_alias=True)["trainer"] == raw["trainer"]
    status_props = crd.status_schema()["properties"]["trainer"]["properties"]
    assert set(status_props) == {"job", "pods", "ready", "succeeded", "restarts"}
