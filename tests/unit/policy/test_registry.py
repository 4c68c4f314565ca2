"""Policy names from a RolloutJob resolve to the functions the services and the simulator call."""

from __future__ import annotations

import pytest

from treadle.errors import SpecError
from treadle.policy import placement, registry


def test_defaults_resolve_to_placement_v1() -> None:
    assert registry.placement_policy(registry.DEFAULT_PLACEMENT) is placement.choose_worker
    assert registry.scheduling_policy(registry.DEFAULT_SCHEDULING) is registry.progressive_priority


@pytest.mark.parametrize(
    ("resolve", "field"),
    [
        (registry.placement_policy, "rollout.placementPolicy"),
        (registry.scheduling_policy, "rollout.schedulingPolicy"),
    ],
    ids=["placement", "scheduling"],
)
def test_unknown_name_names_the_job_field(resolve: object, field: str) -> None:
    with pytest.raises(SpecError) as err:
        resolve("nope")  # type: ignore[operator]
    assert err.value.field == field
    assert "nope" in str(err.value)


def test_least_loaded_ignores_the_previous_worker() -> None:
    workers = [placement.WorkerState("a", "p", 0), placement.WorkerState("b", "p", 1)]
    policy = registry.placement_policy("least-loaded")
    assert policy(workers, eligible_pools=["p"], previous="b") == placement.Decision("a", "least-loaded")
    sticky = registry.placement_policy("sticky-least-loaded")
    assert sticky(workers, eligible_pools=["p"], previous="b") == placement.Decision("b", "sticky")


def test_scheduling_orders() -> None:
    queue = [
        registry.QueuedTurn("x", seq=2, turn=0, task="math"),
        registry.QueuedTurn("y", seq=1, turn=0, task="math"),
        registry.QueuedTurn("z", seq=3, turn=4, task="math"),
    ]
    assert registry.scheduling_policy("fifo")(queue) == ["y", "x", "z"]
    assert registry.scheduling_policy("progressive-priority")(queue) == ["z", "y", "x"]


def test_progressive_priority_ranks_by_predicted_remaining_then_turns() -> None:
    queue = [
        registry.QueuedTurn("x", seq=1, turn=5, task="m", predicted_remaining=10.0),
        registry.QueuedTurn("y", seq=2, turn=0, task="m", predicted_remaining=300.0),
        registry.QueuedTurn("z", seq=3, turn=2, task="m", predicted_remaining=10.0),
    ]
    assert registry.scheduling_policy("progressive-priority")(queue) == ["y", "x", "z"]
    assert registry.scheduling_policy("heddle")(queue) == ["y", "x", "z"]
    assert registry.scheduling_policy("fifo")(queue) == ["x", "y", "z"]


def test_heddle_names_are_registered_with_their_extras() -> None:
    assert (
        "heddle" in registry.PREEMPTIVE_SCHEDULING
        and "progressive-priority" not in registry.PREEMPTIVE_SCHEDULING
    )
    assert "heddle" in registry.BATCH_PLACEMENT and registry.DEFAULT_PLACEMENT not in registry.BATCH_PLACEMENT
    # the per-turn fallback of heddle (a routed worker that left) is sticky least-loaded
    assert registry.placement_policy("heddle") is placement.choose_worker
