"""RolloutJob models: examples parse, invalid manifests fail naming the field, defaults are pinned."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from treadle import errors
from treadle.api import spec_rules, v1alpha1

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = sorted((ROOT / "manifests" / "examples").glob("*.yaml"))
INVALID = sorted((ROOT / "manifests" / "invalid").glob("*.yaml"))


def _header(path: Path, key: str) -> str | None:
    for line in path.read_text().splitlines():
        if line.startswith(f"# {key}:"):
            return line.split(":", 1)[1].strip()
    return None


def _doc(path: Path) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(path.read_text())
    return doc


def test_there_are_four_examples_and_at_least_ten_invalid_manifests() -> None:
    assert len(EXAMPLES) == 4
    assert len(INVALID) >= 10


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_parses(path: Path) -> None:
    job = v1alpha1.parse_job(_doc(path))
    assert job.spec.pools and job.spec.tasks


@pytest.mark.parametrize(
    "path", [p for p in INVALID if _header(p, "update-of") is None], ids=lambda p: p.name
)
def test_invalid_manifest_is_rejected_naming_its_field(path: Path) -> None:
    expected = _header(path, "field")
    assert expected, f"{path.name} lacks a '# field:' header"
    with pytest.raises(errors.SpecError) as info:
        v1alpha1.parse_job(_doc(path))
    assert info.value.field.startswith(expected), (info.value.field, expected)


@pytest.mark.parametrize(
    "path", [p for p in INVALID if _header(p, "update-of") is not None], ids=lambda p: p.name
)
def test_update_cases_are_valid_alone_and_covered_by_a_transition_rule(path: Path) -> None:
    """Immutability needs the old object: only the API server's ``oldSelf`` rules can check it."""
    v1alpha1.parse_job(_doc(path))
    field = _header(path, "field")
    assert field is not None
    generic = field.replace("[0]", "")
    assert any(r.check is None and r.field == generic for r in spec_rules.SPEC_RULES), generic


def test_defaults_fill_a_minimal_spec() -> None:
    spec = v1alpha1.parse_spec(
        {
            "agents": [{"name": "a", "model": "m"}],
            "pools": [{"name": "p", "agent": "a", "accelerator": "H20"}],
            "tasks": [{"name": "t", "agents": ["a"], "environment": "math-tool", "reward": "r"}],
        }
    )
    assert spec.pools[0].replicas == 1
    assert spec.pools[0].tensor_parallel_size == 1
    assert spec.pools[0].preferred_work == "any"
    assert spec.tasks[0].affinity == "auto"
    assert spec.rollout.staleness == 1
    assert spec.rollout.scheduling_policy == "progressive-priority"
    assert spec.rollout.placement_policy == "sticky-least-loaded"
    rb = spec.rollout.rebalance  # FlexMARL §8.1's delta; on by default where two agents share a shape
    assert (rb.enabled, rb.delta, rb.rule, rb.interval_seconds) == (None, 5, "per-instance", 1.0)
    assert (rb.max_moves_per_poll, rb.settle_polls) == (1, 5)
    assert spec.reward.scale_to_zero and spec.reward.min_replicas == 0
    assert spec.weights.store == "mooncake"
    assert not spec.suspend and spec.managed_by is None


def test_models_are_frozen() -> None:
    spec = v1alpha1.parse_job(_doc(EXAMPLES[0])).spec
    with pytest.raises(ValueError, match="frozen"):
        spec.pools[0].replicas = 9  # type: ignore[misc]


def test_round_trip_by_alias_is_stable() -> None:
    for path in EXAMPLES:
        spec = v1alpha1.parse_job(_doc(path)).spec
        again = v1alpha1.parse_spec(spec.model_dump(by_alias=True, exclude_none=True))
        assert again == spec


def test_wrong_kind_is_rejected_naming_api_version() -> None:
    doc = _doc(EXAMPLES[0]) | {"kind": "Deployment"}
    with pytest.raises(errors.SpecError) as info:
        v1alpha1.parse_job(doc)
    assert info.value.field == "apiVersion"


JUDGE = {"name": "judge", "model": "tiny", "weightsGb": 0.1}


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        # llm-judge needs its judge model
        (lambda s: s["reward"].update(type="llm-judge"), "spec.reward.judgeModel"),
        # an agent without any pool could never act
        (lambda s: s["agents"].append({"name": "idle", "model": "m"}), "spec.agents"),
        # a task may be pinned only to pools of its own agents
        (lambda s: s["tasks"][0].update(pools=["other"]), "spec.tasks.pools"),
        # warm sessions need a pod to live in
        (lambda s: s["environment"].update(replicas=0, warmPool=2), "spec.environment.warmPool"),
        # min above max
        (
            lambda s: s["reward"].update(scaleToZero=False, minReplicas=5, maxReplicas=2),
            "spec.reward.minReplicas",
        ),
        # duplicate task names
        (lambda s: s["tasks"].append(dict(s["tasks"][0])), "spec.tasks"),
        # with two agents the trainer must say which it trains
        (lambda s: s.update(trainer={"steps": 5}), "spec.trainer.agent"),
        # reward models need GPUs to run on
        (
            lambda s: s.update(externalResources={"rewardModels": [JUDGE]}),
            "spec.externalResources.rewardModelGpus",
        ),
        # a variant's degree is an aligned chunk size the gateway holds
        (
            lambda s: s.update(
                externalResources={"rewardModelGpus": 2, "rewardModels": [JUDGE | {"parallelism": [4]}]}
            ),
            "spec.externalResources.rewardModels.parallelism",
        ),
        (
            lambda s: s.update(
                externalResources={"rewardModelGpus": 8, "rewardModels": [JUDGE | {"parallelism": [3]}]}
            ),
            "spec.externalResources.rewardModels.parallelism",
        ),
        # judge:<name> names a declared reward model
        (lambda s: s["tasks"][0].update(reward="judge:nobody"), "spec.tasks.reward"),
    ],
    ids=[
        "judge-model",
        "agent-without-pool",
        "task-pool-of-other-agent",
        "warm-pool",
        "min-max",
        "dup-task",
        "trainer-agent",
        "reward-models-without-gpus",
        "parallelism-above-gpus",
        "parallelism-unaligned",
        "judge-undeclared",
    ],
)
def test_cross_field_rules(mutate: Any, field: str) -> None:
    spec: dict[str, Any] = {
        "agents": [{"name": "a", "model": "m"}, {"name": "b", "model": "m"}],
        "pools": [
            {"name": "pa", "agent": "a", "accelerator": "H20"},
            {"name": "other", "agent": "b", "accelerator": "H800"},
        ],
        "tasks": [{"name": "t", "agents": ["a"], "environment": "math-tool", "reward": "r"}],
        "reward": {},
        "environment": {},
    }
    v1alpha1.parse_spec(spec)
    mutate(spec)
    with pytest.raises(errors.SpecError) as info:
        v1alpha1.parse_spec(spec)
    assert info.value.field == field


def test_the_simulators_baseline_policies_are_accepted_only_in_a_simulation() -> None:
    doc = _doc(EXAMPLES[0])
    doc["spec"]["rollout"] = {"placementPolicy": "pinned", "schedulingPolicy": "fifo"}
    assert v1alpha1.parse_job(doc, simulation=True).spec.rollout.placement_policy == "pinned"
    with pytest.raises(errors.SpecError) as info:
        v1alpha1.parse_job(doc)
    assert info.value.field == "spec.rollout.placementPolicy" and "sticky-least-loaded" in str(info.value)
    doc["spec"]["rollout"] = {"schedulingPolicy": "pinned"}
    with pytest.raises(errors.SpecError) as info:
        v1alpha1.parse_job(doc, simulation=True)
    assert info.value.field == "spec.rollout.schedulingPolicy"


def test_a_trainer_names_its_agent_or_the_job_has_one() -> None:
    spec: dict[str, Any] = {
        "agents": [{"name": "a", "model": "/models/tiny-llama-seed0"}],
        "pools": [{"name": "p", "agent": "a", "accelerator": "H20"}],
        "tasks": [{"name": "t", "agents": ["a"], "environment": "math-tool", "reward": "letter-fraction"}],
        "trainer": {
            "gpus": 1,
            "accelerator": "H800",
            "steps": 5,
            "env": [{"name": "HF_HOME", "value": "/c"}],
        },
    }
    trainer = v1alpha1.parse_spec(spec).trainer
    assert trainer is not None and trainer.agent is None and trainer.steps == 5 and trainer.command == []
    assert v1alpha1.parse_spec({**spec, "trainer": {"agent": "a"}}).trainer is not None
    assert v1alpha1.parse_spec({k: v for k, v in spec.items() if k != "trainer"}).trainer is None
    with pytest.raises(errors.SpecError) as info:
        v1alpha1.parse_spec({**spec, "trainer": {"learningRate": 0}})
    assert info.value.field == "spec.trainer.learningRate"
    for env in ([{"name": "TREADLE_CONFIG", "value": "/x"}], [{"name": "A"}, {"name": "A", "value": "2"}]):
        with pytest.raises(errors.SpecError) as info:
            v1alpha1.parse_spec({**spec, "trainer": {"env": env}})
        assert info.value.field == "spec.trainer.env"
