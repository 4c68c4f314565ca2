"""Alg. 1 + Alg. 2: hand-checked cases, the head is never starved, grants always fit."""

from __future__ import annotations

import random

import pytest

from treadle.errors import SpecError
from treadle.policy.tangram import buddy, model, pools, profile, schedule

LINEAR = model.Elasticity((1.0,) * 32)


def _elastic(i: int, t_ori: float = 60.0, top: int = 32) -> model.Action:
    return model.Action(f"e{i}", "cpu", {"cpu": tuple(range(1, top + 1))}, t_ori, LINEAR)


def _fixed(i: int, dur: float = 1.0, cores: int = 1) -> model.Action:
    return model.Action(f"f{i}", "cpu", {"cpu": (cores,)}, dur)


def _units(grants: list[model.Grant]) -> list[tuple[str, int]]:
    return [(g.action_id, g.units["cpu"]) for g in grants]


@pytest.mark.parametrize(
    ("depth", "expect"),
    [
        # The digest's toy (§1.5): 8 units, 12 identical linear actions of T_ori 60.
        (1, [("e0", 2), ("e1", 2), ("e2", 2), ("e3", 2)]),  # evicts 4, obj 840
        (2, [(f"e{i}", 1) for i in range(8)]),  # stops at t = 1, obj 930
    ],
    ids=["depth1-evicts-four", "depth2-keeps-all"],
)
def test_digest_toy(depth: int, expect: list[tuple[str, int]]) -> None:
    waiting = [_elastic(i) for i in range(12)]
    grants = schedule.decide(waiting, [], {"cpu": pools.FlatPool(8, 8)}, schedule.Settings(depth=depth))
    assert _units(grants) == expect


def test_a_lone_elastic_action_gets_the_whole_free_pool() -> None:
    grants = schedule.decide([_elastic(0)], [model.Running("cpu", 4, 3.0)], {"cpu": pools.FlatPool(12, 16)})
    assert _units(grants) == [("e0", 12)]


def test_unknown_elasticity_runs_at_its_minimum() -> None:
    unknown = model.Action("u", "cpu", {"cpu": (2, 4, 8)}, 10.0)
    assert _units(schedule.decide([unknown], [], {"cpu": pools.FlatPool(8, 8)})) == [("u", 2)]


def test_admission_is_an_fcfs_prefix_across_resource_types() -> None:
    """The head waits on the API quota, so nothing behind it runs (the paper's strict prefix)."""
    api = model.Action("api", "search", {"search": (1,)}, 0.5)
    waiting = [_fixed(0), api, _fixed(1)]
    status = {"cpu": pools.FlatPool(8, 8), "search": pools.FlatPool(0, 4)}
    assert _units(schedule.decide(waiting, [], status)) == [("f0", 1)]


def test_gpu_group_gets_buddy_feasible_amounts() -> None:
    eff = model.Elasticity(tuple(1.0 / (0.1 * m + 0.9) for m in range(1, 9)))
    waiting = [model.Action(f"g{i}", "gpu", {"gpu": (1, 2, 4, 8)}, 4.0, eff) for i in range(3)]
    status = {"gpu": pools.ChunkPool((1, 1, 1, 0), 8)}  # 1 + 2 + 4 free GPUs on one node
    grants = schedule.decide(waiting, [], status)
    sizes = sorted(g.units["gpu"] for g in grants)
    demand = tuple(sizes.count(s) for s in buddy.SIZES)
    assert buddy.fits((1, 1, 1, 0), demand)  # type: ignore[arg-type]
    assert grants[0].action_id == "g0"


def _random_queue(rng: random.Random) -> tuple[list[model.Action], int, int]:
    total = rng.choice((4, 8, 16, 32))
    free = rng.randint(1, total)
    eff = profile.fit([(m, rng.uniform(0, 0.3) + 1.0 / m) for m in (1, 2, 4, 8)], 32)
    waiting = []
    for i in range(rng.randint(1, 40)):
        if rng.random() < 0.5:
            waiting.append(
                model.Action(f"e{i}", "cpu", {"cpu": tuple(range(1, 33))}, rng.uniform(1, 100), eff)
            )
        else:
            waiting.append(_fixed(i, rng.uniform(0.01, 5), cores=rng.randint(1, 2)))
    return waiting, free, total


@pytest.mark.parametrize("strict", [True, False], ids=["head-always-runs", "bounded-wait"])
@pytest.mark.parametrize("seed", range(40))
def test_grants_fit_keep_fcfs_order_and_the_head_runs(seed: int, strict: bool) -> None:
    rng = random.Random(seed)
    waiting, free, total = _random_queue(rng)
    running = [model.Running("cpu", 1, rng.uniform(0, 10)) for _ in range(total - free)]
    settings = schedule.Settings(rng.randint(1, 3), rng.choice((None, 0, 5)), head_always_runs=strict)
    grants = schedule.decide(waiting, running, {"cpu": pools.FlatPool(free, total)}, settings)
    if waiting[0].min_units <= free and (strict or not running):
        assert grants and grants[0].action_id == waiting[0].id
    if grants:  # the head is first or nothing runs: FCFS
        assert grants[0].action_id == waiting[0].id or waiting[0].min_units > free
    assert sum(g.units["cpu"] for g in grants) <= free
    by_id = {a.id: a for a in waiting}
    assert all(g.units["cpu"] in by_id[g.action_id].cost["cpu"] for g in grants)
    order = [a.id for a in waiting]
    assert [order.index(g.action_id) for g in grants] == sorted(order.index(g.action_id) for g in grants)


@pytest.mark.parametrize("seed", range(200))
def test_the_head_is_never_starved_over_rounds(seed: int) -> None:
    """While the head waits, nothing of its resource starts behind it, so it runs at the latest once
    the actions running when it arrived have all ended: a round per completion, short actions
    arriving all along."""
    rng = random.Random(seed)
    waiting, free, total = _random_queue(rng)
    now = 0.0
    ends = [rng.uniform(0, 10) for _ in range(total - free)]
    bound = len(ends) + 1
    head = waiting[0].id
    for _ in range(bound):
        running = [model.Running("cpu", 1, e - now) for e in ends]
        grants = schedule.decide(waiting, running, {"cpu": pools.FlatPool(total - len(ends), total)})
        by_id = {a.id: a for a in waiting}
        for g in grants:
            ends += [now + by_id[g.action_id].duration(g.units["cpu"])] * g.units["cpu"]
        if head in {g.action_id for g in grants}:
            return
        waiting = [a for a in waiting if a.id not in {g.action_id for g in grants}]
        waiting.append(_fixed(1000 + len(waiting), 0.01))
        now = min(ends)
        ends.remove(now)
    pytest.fail(f"the head waited more than {bound} rounds")


def test_the_strict_head_runs_at_once() -> None:
    """A stream of short actions behind an elastic head: the head runs in the first round it fits."""
    waiting = [_elastic(0, t_ori=1000.0)] + [_fixed(i, 0.01) for i in range(50)]
    status = {"cpu": pools.FlatPool(1, 8)}
    strict = schedule.Settings(head_always_runs=True)
    assert _units(schedule.decide(waiting, [model.Running("cpu", 7, 0.01)], status, strict)) == [("e0", 1)]
    # The bounded wait: 7 cores free in 0.01 s, so the long elastic head waits for its second amount.
    assert schedule.decide(waiting, [model.Running("cpu", 7, 0.01)], status) == []


def test_an_unknown_resource_type_names_the_field() -> None:
    odd = model.Action("x", "cpu", {"cpu": (1,), "fax": (1,)}, 1.0)
    with pytest.raises(SpecError) as info:
        schedule.decide([odd], [], {"cpu": pools.FlatPool(1, 1)})
    assert info.value.field == "cost.fax"


def test_estimate_pops_one_entry_per_unit() -> None:
    """Two idle units, both busy until 5: a 2-unit action of 1 s ends at 6 (starts at the later free)."""
    wide = model.Action("w", "cpu", {"cpu": (2,)}, 1.0)
    assert schedule.estimate([0.0, 5.0], [wide], depth=2) == pytest.approx(6.0)
    assert schedule.estimate([0.0, 5.0], [_fixed(0), _fixed(1)], depth=1) == pytest.approx(1.0 + 2.0)
