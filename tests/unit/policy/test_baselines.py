"""Baseline placement policies, and that the registry's names win over them."""

from __future__ import annotations

import pytest

from treadle import errors
from treadle.policy import baselines, placement, registry

W = placement.WorkerState
WORKERS = [
    W("w0", "h800", load=5),
    W("w1", "h800", load=0),
    W("w2", "h20", load=1),
    W("w3", "h800", load=0, healthy=False),
]


@pytest.mark.parametrize(
    "previous,assigned,want",
    [
        ("w0", {}, "w0"),  # pinned: stays on a loaded previous worker (sticky-least-loaded would move)
        (None, {}, "w1"),  # first turn: least-loaded healthy candidate
        ("w3", {}, "w1"),  # previous unhealthy: re-placed
        ("w2", {}, "w1"),  # previous outside the eligible pools: re-placed
    ],
    ids=["stays-pinned", "first-turn", "previous-unhealthy", "previous-ineligible"],
)
def test_pinned(previous: str | None, assigned: dict[str, int], want: str) -> None:
    decision = baselines.pinned(WORKERS, eligible_pools=["h800"], previous=previous, assigned=assigned)
    assert decision is not None and decision.worker_id == want


def test_round_robin_cycles_over_candidates() -> None:
    assigned: dict[str, int] = {}
    seen = []
    for _ in range(5):
        decision = baselines.round_robin(WORKERS, eligible_pools=["h800", "h20"], assigned=assigned)
        assert decision is not None
        seen.append(decision.worker_id)
        assigned[decision.worker_id] = assigned.get(decision.worker_id, 0) + 1
    assert seen == ["w0", "w1", "w2", "w0", "w1"]  # ignores load; w3 is unhealthy


def test_no_candidate_is_none() -> None:
    assert baselines.round_robin(WORKERS, eligible_pools=["cpu"]) is None
    assert baselines.pinned(WORKERS, eligible_pools=["cpu"], previous="w0") is None


def test_lookup_prefers_the_registry_and_names_the_field() -> None:
    assert (
        baselines.placement_policy("sticky-least-loaded")
        is registry.PLACEMENT_POLICIES["sticky-least-loaded"]
    )
    assert baselines.placement_policy("pinned") is baselines.pinned
    with pytest.raises(errors.SpecError) as info:
        baselines.placement_policy("telepathy")
    assert info.value.field == registry.PLACEMENT_FIELD
