"""The simulator's placement shortlist gives exactly the decision the policy makes over all workers."""

from __future__ import annotations

import random
from typing import Any

import pytest

from treadle.sim import engine, entities, placer, scenario


@pytest.mark.parametrize("policy", sorted(placer.SHORTLIST))
@pytest.mark.parametrize("seed", range(5))
def test_shortlist_decision_equals_full_decision(tiny: dict[str, Any], policy: str, seed: int) -> None:
    tiny["job"]["spec"]["pools"][0]["replicas"] = 7
    tiny["job"]["spec"]["pools"][1]["replicas"] = 5
    tiny["job"]["spec"]["rollout"]["placementPolicy"] = policy
    sim = engine.Simulator(scenario.parse(tiny).config("rollart"))  # rollart keeps the job's policy
    rng = random.Random(seed)
    traj = entities.Trajectory(
        idx=0,
        name="t0",
        group=0,
        task=0,
        shape_inputs=(1,),
        shape_responses=(1,),
        shape_tools=(0.0,),
        reset_s=0.0,
        init_version=0,
        started_at=0.0,
    )
    for _ in range(200):
        for w in rng.sample(sim.workers, 3):  # loads and counters drift as a run would move them
            for _ in range(rng.randint(0, 3)):
                w.waiting.append(
                    entities.Request(traj=0, new_tokens=1, cached_tokens=0, remaining=1, context=1, seq=0)
                )
            if w.waiting and rng.random() < 0.5:
                w.waiting.pop()
            w.assigned += rng.randint(0, 2)
            sim.placer.touch(w)
        traj.worker = rng.choice([-1, *range(len(sim.workers))])
        pools = rng.choice([("h800",), ("h20",), ("h20", "h800")])
        short = sim.placer.choose(traj, pools)
        full = sim.placer.place(
            [placer.state(w) for w in sim.workers],
            eligible_pools=pools,
            previous=sim.workers[traj.worker].worker_id if traj.worker >= 0 else None,
            assigned={w.worker_id: w.assigned for w in sim.workers},
        )
        assert full is not None and short.worker_id == full.worker_id
