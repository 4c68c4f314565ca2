"""The systems the simulator compares: RollArt and the baselines of its §7, plus verl/slime-likes.

Called by ``treadle.sim.scenario`` to turn a scenario's ``systems: [...]`` into runs. A system is
(a) how the rollout loop is driven (``mode``, env interaction, reward, weight sync) and (b)
overrides of RolloutJob fields -- ``rollout.placementPolicy``, ``rollout.schedulingPolicy``,
``rollout.staleness`` -- so that every policy is still selected by the job's own fields.

Sources (RollArt digest §3): Sync = standard synchronous pipeline; Sync+ = Sync + async reward +
trajectory-level env interaction + serverless reward; One-off = consumes the previous step's
trajectories, all finish under stale weights; AReaL = staleness bound 1 checked only at trajectory
start; RollArt = per-iteration staleness aborts + hardware affinity + Mooncake overlap (+ redundant
env rollouts where the task asks). verl/verl*/slime come from the Heddle digest's baselines.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Literal

from treadle import errors


@dataclasses.dataclass(frozen=True)
class System:
    name: str
    description: str
    mode: Literal["sync", "one-off", "async"]
    env_interaction: Literal["trajectory", "batch"] = "trajectory"
    """``batch``: every turn waits for the whole batch's generations, then the whole batch's env steps."""
    reward: Literal["serverless", "local"] = "serverless"
    weight_sync: Literal["mooncake", "nccl", "naive"] = "nccl"
    admission: Literal["staleness", "concurrency"] = "staleness"
    """``staleness``: AReaL's rule (``admission.admit_groups`` with alpha) gates every start; RollArt's
    ROLL code does the same in groups (``async_generation_ratio`` steps ahead, digest §1.5).
    ``concurrency``: every free environment starts a trajectory (only ``max_in_flight`` bounds
    starts), as a fully asynchronous slime-like rollout does."""
    per_iteration_abort: bool = False
    """RollArt: after each version commit abort in-flight trajectories older than ``version - alpha``
    and evict stale groups before ``get_batch``; AReaL checks only at admission."""
    affinity: bool = False
    """Route by ``tasks[].affinity`` / ``pools[].preferredWork``; off means every pool is eligible."""
    colocated: bool = False
    """Training time-shares the rollout GPUs (verl-like); off means a separate training pool."""
    redundancy: bool = False
    """Honour ``tasks[].redundancy`` (launch extra group members, keep the first to finish)."""
    overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """RolloutJob ``spec.rollout`` fields this system sets (camelCase, as in the manifest)."""


SYSTEMS: Mapping[str, System] = {
    s.name: s
    for s in (
        System(
            "sync",
            "synchronous, batch env interaction, dedicated reward GPUs, trajectories pinned (verl-like)",
            mode="sync",
            env_interaction="batch",
            reward="local",
            colocated=True,
            overrides={"placementPolicy": "pinned", "schedulingPolicy": "fifo"},
        ),
        System(
            "sync-plus",
            "Sync+ (RollArt §7.1): sync with async reward, trajectory-level env, serverless reward",
            mode="sync",
            overrides={"placementPolicy": "pinned", "schedulingPolicy": "fifo"},
        ),
        System(
            "verl-star",
            "verl*-like: sync+, least-loaded placement per turn (forgets the prefix cache)",
            mode="sync",
            colocated=True,
            overrides={"placementPolicy": "least-loaded", "schedulingPolicy": "fifo"},
        ),
        System(
            "round-robin",
            "sync+ with round-robin placement and FCFS scheduling",
            mode="sync",
            colocated=True,
            overrides={"placementPolicy": "round-robin", "schedulingPolicy": "fifo"},
        ),
        System(
            "one-off",
            "One-off (DeepScaleR-style): rollout k+1 overlaps training k, every trajectory finishes stale",
            mode="one-off",
            overrides={"placementPolicy": "sticky-least-loaded", "schedulingPolicy": "fifo"},
        ),
        System(
            "areal",
            "AReaL-like: async, staleness alpha checked only at admission, no affinity",
            mode="async",
            overrides={"placementPolicy": "sticky-least-loaded", "schedulingPolicy": "fifo", "staleness": 1},
        ),
        System(
            "slime",
            "slime-like: fully async, every free environment starts a trajectory, least-loaded router",
            mode="async",
            admission="concurrency",
            overrides={"placementPolicy": "least-loaded", "schedulingPolicy": "fifo"},
        ),
        System(
            "rollart-no-affinity",
            "RollArt without hardware affinity (every pool eligible)",
            mode="async",
            weight_sync="mooncake",
            per_iteration_abort=True,
            redundancy=True,
        ),
        System(
            "rollart",
            "RollArt: per-iteration staleness aborts, hardware affinity, Mooncake overlap, redundancy",
            mode="async",
            weight_sync="mooncake",
            per_iteration_abort=True,
            affinity=True,
            redundancy=True,
        ),
    )
}


def system(name: str) -> System:
    try:
        return SYSTEMS[name]
    except KeyError:
        raise errors.SpecError(
            f"unknown system {name!r}; known: {sorted(SYSTEMS)}", field="simulation.systems"
        ) from None


def with_changes(base: System, **changes: Any) -> System:
    """A variant of ``base`` (ablations: reward mode, env interaction, affinity on/off)."""
    unknown = set(changes) - {f.name for f in dataclasses.fields(System)}
    if unknown:
        raise errors.SpecError(f"unknown system fields {sorted(unknown)}", field="simulation.variants")
    return dataclasses.replace(base, **changes)
