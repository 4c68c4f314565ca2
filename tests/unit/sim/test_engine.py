"""Whole simulated runs of the tiny scenario: invariants, reproducibility, mechanisms."""

from __future__ import annotations

from typing import Any

import pytest

from treadle import errors
from treadle.sim import engine, scenario
from treadle.sim import metrics as metrics_mod

RUNS = [
    "sync",
    "sync-plus",
    "verl-star",
    "round-robin",
    "one-off",
    "areal",
    "slime",
    "rollart",
    "rollart-local-reward",
]


def _run(raw: dict[str, Any], name: str, **changes: Any) -> tuple[engine.Simulator, metrics_mod.Result]:
    sim = engine.Simulator(scenario.parse(raw).config(name, **changes))
    return sim, sim.run()


@pytest.mark.parametrize("name", RUNS)
def test_every_system_trains_every_step_and_accounts_for_every_trajectory(
    tiny: dict[str, Any], name: str
) -> None:
    sim, result = _run(tiny, name)
    assert len(result.steps) == 4
    assert all(s.trajectories >= 16 for s in result.steps)  # whole groups: at least the batch
    states = [t.state for t in sim.trajs]
    assert set(states) <= {"reset", "generating", "tool", "reward", "done", "aborted"} | {
        s for s in states if s.startswith("barrier:")
    }
    in_flight = sum(1 for s in states if s not in ("done", "aborted"))
    assert in_flight == sim.running  # the admission counter matches the trajectories
    aborted = sum(1 for s in states if s == "aborted")
    # every trajectory is running, accepted, rejected when aborted, or rejected when evicted
    assert sim.accepted + sim.running + aborted + result.evicted == len(sim.trajs)
    assert result.trained == len(set(sim.used))  # nothing trained twice
    assert all(sim.trajs[i].state == "done" for i in sim.used)
    assert result.total_s >= result.lower_bound_s > 0
    for pool in result.pools:
        assert 0.0 <= pool.busy_share <= 1.0 + 1e-9


@pytest.mark.parametrize("alpha", [0, 1])
def test_rollart_bounds_staleness_every_iteration_areal_only_at_admission(
    tiny: dict[str, Any], alpha: int
) -> None:
    # RollArt footnote 1: AReaL's start-only bound lets long tails arrive staler than alpha
    tiny["job"]["spec"]["rollout"]["staleness"] = alpha
    tiny["simulation"]["steps"] = 8
    _, rollart = _run(tiny, "rollart")
    _, areal = _run(tiny, "areal")
    assert rollart.max_staleness <= alpha
    assert rollart.evicted + rollart.aborted_stale > 0  # the price: work thrown away
    assert areal.max_staleness > alpha
    assert areal.evicted == areal.aborted_stale == 0


def test_sync_trains_on_fresh_data_only(tiny: dict[str, Any]) -> None:
    _, result = _run(tiny, "sync-plus")
    assert result.max_staleness == 0


def test_same_seed_same_result_other_seed_other_result(tiny: dict[str, Any]) -> None:
    _, a = _run(tiny, "rollart")
    _, b = _run(tiny, "rollart")
    _, c = _run(tiny, "rollart", seed=4)
    assert a.summary() | {"wall_s": 0} == b.summary() | {"wall_s": 0}
    assert a.total_s != c.total_s


def test_rollart_aborts_redundant_siblings_and_routes_by_affinity(tiny: dict[str, Any]) -> None:
    sim, result = _run(tiny, "rollart")
    assert result.aborted_redundant > 0  # math groups launch 6 and keep the first 4
    pools_of = {sim.tasks[i].name: sim.tasks[i].eligible["policy"] for i in range(len(sim.tasks))}
    assert pools_of == {"game": ("h800",), "math": ("h20",)}
    for traj in sim.trajs:
        if traj.worker >= 0:
            assert sim.workers[traj.worker].pool in pools_of[sim.tasks[traj.task].name]


def test_baselines_ignore_affinity_and_redundancy(tiny: dict[str, Any]) -> None:
    sim, result = _run(tiny, "areal")
    assert result.aborted_redundant == 0
    assert all(t.eligible["policy"] == ("h20", "h800") for t in sim.tasks)


def test_batch_env_interaction_waits_for_the_whole_batch(tiny: dict[str, Any]) -> None:
    # RollArt R2: the same system with per-turn barriers is slower than trajectory-level interaction
    tiny["simulation"]["variants"] = {"sync-trajectory": {"base": "sync", "env_interaction": "trajectory"}}
    _, batch = _run(tiny, "sync")
    _, trajectory_level = _run(tiny, "sync-trajectory")
    assert batch.step_time_s > trajectory_level.step_time_s


def test_a_stalled_run_is_an_error_not_a_hang(tiny: dict[str, Any]) -> None:
    tiny["job"]["spec"]["rollout"]["batchSize"] = 16
    tiny["simulation"]["max_in_flight"] = 2  # fewer than one group of 4: nothing can ever start
    with pytest.raises(errors.Unavailable, match="stalled"):
        _run(tiny, "rollart")
