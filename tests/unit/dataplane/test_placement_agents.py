"""Placement for multi-agent jobs: per-agent turns and inter-agent rebalancing (FlexMARL §5.2).

The synchronous half (``PlacementService.plan_rebalance`` / ``finish_move``) is driven directly;
the asynchronous half (``rebalance.Rebalancer``) with a recording swapper and an injected sleep
that releases turns, so nothing waits on a clock. Real engines and agents: tests/integration.
"""

from __future__ import annotations

import random

import prometheus_client as prom
import pytest

from treadle import errors, metrics
from treadle.api import jobconfig
from treadle.services.placement import protocol as placement_protocol
from treadle.services.placement import rebalance, service
from treadle.v1 import placement_pb2 as pb

POOLS = {"plan": "prefill-heavy", "exec": "decode-heavy"}
AGENTS = {"plan": "planner", "exec": "executor"}
SHAPE = {"plan": "7b/tp1/H20", "exec": "7b/tp1/H20"}


def make(
    workers: dict[str, str], *, shapes: dict[str, str] = SHAPE, rule: str = "per-instance", step: int = 0
) -> service.PlacementService:
    """Placement with ``step`` 0 by default: the rule's own k, which these tables check."""
    svc = service.PlacementService(
        pools=POOLS, tasks={"pe": jobconfig.TaskPlacement()}, pool_agents=AGENTS, pool_shapes=shapes,
        rebalance_rule=rule, rebalance_step=step,  # type: ignore[arg-type]
    )  # fmt: skip
    for wid, pool in workers.items():
        svc.register_worker(
            pb.Worker(worker_id=wid, pool=pool, address=f"http://{wid}", engine_address=f"e-{wid}")
        )
    return svc


def assign(svc: service.PlacementService, tid: str, agent: str) -> placement_protocol.Assignment:
    return svc.assign(placement_protocol.AssignRequest(trajectory_id=tid, task="pe", agent=agent))


def release(svc: service.PlacementService, tid: str, worker: str) -> None:
    svc.release(
        placement_protocol.ReleaseRequest(trajectory_id=tid, worker_id=worker, task="pe", turn_finished=True)
    )


def agents_of(svc: service.PlacementService) -> dict[str, int]:
    return {a.agent: a.instances for a in svc.pool_state().agents}


def test_a_turn_goes_only_to_a_worker_of_its_agent_whatever_the_affinity() -> None:
    svc = make({"p0": "plan", "e0": "exec", "e1": "exec"})
    # "pe" resolves to decode-heavy work, which the planner's pool does not prefer: it still serves.
    got = [assign(svc, f"t{i}", "planner") for i in range(3)]
    assert {(a.worker_id, a.agent, a.pool) for a in got} == {("p0", "planner", "plan")}
    got = [assign(svc, f"t{i}", "executor") for i in range(4)]
    assert sorted(a.worker_id for a in got) == ["e0", "e0", "e1", "e1"] and {a.agent for a in got} == {
        "executor"
    }
    # stickiness is per (trajectory, agent): t0's executor turn stays on its executor worker
    release(svc, "t0", got[0].worker_id)
    assert assign(svc, "t0", "executor").worker_id == got[0].worker_id


def test_unknown_agent_names_the_field_and_changes_nothing() -> None:
    svc = make({"p0": "plan"})
    with pytest.raises(errors.SpecError) as exc:
        assign(svc, "t", "critic")
    assert exc.value.field == "agent"
    assert svc.pool_state().workers[0].outstanding == 0


def test_pool_agents_must_cover_known_pools() -> None:
    with pytest.raises(errors.SpecError) as exc:
        service.PlacementService(pools=POOLS, tasks={}, pool_agents={"plan": "planner"})
    assert exc.value.field == "pool_agents"
    with pytest.raises(errors.SpecError) as exc:
        service.PlacementService(pools=POOLS, tasks={}, pool_agents={**AGENTS, "gpu9": "x"})
    assert exc.value.field == "pool_agents.gpu9"


def load_planner(svc: service.PlacementService, turns: int) -> None:
    for i in range(turns):
        assign(svc, f"q{i}", "planner")


def test_a_busy_agent_receives_a_drained_worker_that_serves_it_after_the_move() -> None:
    svc = make({"p0": "plan", "e0": "exec", "e1": "exec", "e2": "exec"})
    load_planner(svc, 12)  # 12 queued on one planner worker, nothing on three executor workers
    busy = assign(svc, "x", "executor").worker_id  # the executor worker with a turn is not the one moved
    move = svc.plan_rebalance()
    assert move is not None and (move.donor, move.receiver) == ("executor", "planner")
    # per-instance: 12/(1+k) vs 1/(3-k) -> k = 2 lowers the larger pressure most (4 vs 1)
    assert len(move.instance_ids) == 2 and busy not in move.instance_ids
    state = {w.worker.worker_id: w for w in svc.pool_state().workers}
    assert all(state[w].moving_to == "planner" and not state[w].load.healthy for w in move.instance_ids)
    assert svc.plan_rebalance() is None  # one move at a time
    # while moving, a worker serves no one: executor turns go to the one left
    assert {assign(svc, f"y{i}", "executor").worker_id for i in range(3)} == {busy}
    for wid in move.instance_ids:
        svc.finish_move(wid, loaded=0)
    state = {w.worker.worker_id: w for w in svc.pool_state().workers}
    assert all((state[w].agent, state[w].worker.pool, state[w].moving_to) == ("planner", "plan", "")
               for w in move.instance_ids)  # fmt: skip
    assert agents_of(svc) == {"executor": 1, "planner": 3}
    pools = svc.pool_state()
    assert pools.rebalance_moves == 2
    assert {a.agent: (a.moved_in, a.moved_out) for a in pools.agents} == {
        "executor": (0, 2),
        "planner": (2, 0),
    }
    sample = svc.registry.get_sample_value(
        metrics.PLACEMENT_REBALANCE_MOVES_TOTAL, {"donor": "executor", "receiver": "planner"}
    )
    assert sample == 2.0
    # the moved workers now take planner turns
    got = {assign(svc, f"z{i}", "planner").worker_id for i in range(6)}
    assert set(move.instance_ids) <= got


def test_the_default_step_moves_one_worker_per_poll_the_least_loaded() -> None:
    svc = service.PlacementService(
        pools=POOLS, tasks={"pe": jobconfig.TaskPlacement()}, pool_agents=AGENTS, pool_shapes=SHAPE
    )
    for wid, pool in {"p0": "plan", "e0": "exec", "e1": "exec", "e2": "exec"}.items():
        svc.register_worker(pb.Worker(worker_id=wid, pool=pool, address=wid, engine_address=wid))
    load_planner(svc, 12)
    busy = assign(svc, "x", "executor").worker_id
    move = svc.plan_rebalance()  # the rule says 2 (see above); one moves, then the queues are measured again
    assert move is not None and len(move.instance_ids) == 1 and move.instance_ids[0] != busy
    with pytest.raises(errors.SpecError) as exc:
        service.PlacementService(pools=POOLS, tasks={}, rebalance_step=-1)
    assert exc.value.field == "rebalance_step"


def test_no_move_from_an_agent_with_one_worker_nor_across_shapes() -> None:
    svc = make({"p0": "plan", "e0": "exec"})
    load_planner(svc, 40)
    assert svc.plan_rebalance() is None  # the executor's only worker stays
    svc = make(
        {"p0": "plan", "e0": "exec", "e1": "exec"}, shapes={"plan": "14b/tp2/H800", "exec": "7b/tp1/H20"}
    )
    load_planner(svc, 40)
    assert svc.plan_rebalance() is None  # a 7B TP1 instance cannot serve a 14B TP2 agent


def test_a_move_that_failed_returns_the_worker_to_its_donor() -> None:
    svc = make({"p0": "plan", "e0": "exec", "e1": "exec"})
    load_planner(svc, 20)
    move = svc.plan_rebalance()
    assert move is not None and len(move.instance_ids) == 1
    svc.finish_move(move.instance_ids[0], loaded=None)
    assert agents_of(svc) == {"executor": 2, "planner": 1} and svc.pool_state().rebalance_moves == 0
    with pytest.raises(errors.Conflict):
        svc.finish_move(move.instance_ids[0], loaded=0)


@pytest.mark.parametrize("rule", ["literal", "per-instance"])
@pytest.mark.parametrize("seed", range(20))
def test_rebalancing_never_leaves_an_agent_without_a_worker(seed: int, rule: str) -> None:
    rng = random.Random(seed)
    workers = {f"p{i}": "plan" for i in range(rng.randint(1, 3))} | {
        f"e{i}": "exec" for i in range(rng.randint(1, 4))
    }
    svc = make(workers, rule=rule)
    outstanding: list[tuple[str, str]] = []
    for step in range(30):
        for i in range(rng.randint(0, 15)):
            agent = rng.choice(["planner", "planner", "executor"])
            tid = f"s{step}-{i}"
            outstanding.append((tid, assign(svc, tid, agent).worker_id))
        rng.shuffle(outstanding)
        for tid, wid in outstanding[: rng.randint(0, len(outstanding))]:
            release(svc, tid, wid)
            outstanding.remove((tid, wid))
        move = svc.plan_rebalance()
        serving = agents_of(svc)
        assert min(serving.values()) >= 1, (step, serving)
        if move is not None:
            for wid in move.instance_ids:
                svc.finish_move(wid, loaded=0 if rng.random() < 0.8 else None)
        assert min(agents_of(svc).values()) >= 1
        assert sum(agents_of(svc).values()) == len(workers)


class RecordingSwapper:
    def __init__(self, *, fail: bool = False) -> None:
        self.calls: list[tuple[str, str, int]] = []
        self.fail = fail

    async def swap(self, worker: pb.Worker, *, agent: str, version: int) -> None:
        self.calls.append((worker.worker_id, agent, version))
        if self.fail:
            raise errors.Unavailable("engine gone")


async def test_rebalancer_waits_for_the_drain_then_swaps_to_the_receivers_version() -> None:
    svc = make({"p0": "plan", "e0": "exec", "e1": "exec"})
    svc.report_load(pb.WorkerLoad(worker_id="p0", healthy=True, policy_version=7))
    load_planner(svc, 20)
    turn_on_e = [(f"r{i}", assign(svc, f"r{i}", "executor").worker_id) for i in range(2)]  # one each
    sleeps: list[float] = []

    async def sleep(s: float) -> None:
        sleeps.append(s)
        if len(sleeps) == 3:  # the drain finishes a few polls in
            for tid, wid in turn_on_e:
                release(svc, tid, wid)

    swapper = RecordingSwapper()
    loop = rebalance.Rebalancer(svc, swapper, interval_s=1.0, sleep=sleep)
    assert await loop.poll_once() == 1
    ((wid, agent, version),) = swapper.calls
    assert (agent, version) == ("planner", 7) and len(sleeps) >= 3  # swapped only once drained
    assert agents_of(svc) == {"executor": 1, "planner": 2}
    assert svc.worker_info(wid).pool == "plan"
    # until its next report the moved worker counts with the version it loaded, not its donor's
    assert {w.worker.worker_id: w.load.policy_version for w in svc.pool_state().workers}[wid] == 7


async def test_rebalancer_abandons_a_move_that_does_not_drain_or_swap() -> None:
    svc = make({"p0": "plan", "e0": "exec", "e1": "exec"})
    load_planner(svc, 20)
    for i in range(2):
        assign(svc, f"r{i}", "executor")  # never released

    async def sleep(s: float) -> None:
        return None

    swapper = RecordingSwapper()
    loop = rebalance.Rebalancer(svc, swapper, drain_timeout_s=0.1, sleep=sleep)
    assert await loop.poll_once() == 0 and swapper.calls == [] and loop.failed == 1
    assert agents_of(svc) == {"executor": 2, "planner": 1}
    svc = make({"p0": "plan", "e0": "exec", "e1": "exec"})
    load_planner(svc, 20)
    loop = rebalance.Rebalancer(svc, RecordingSwapper(fail=True), sleep=sleep)
    assert await loop.poll_once() == 0 and loop.failed == 1
    assert agents_of(svc) == {"executor": 2, "planner": 1}


def test_rebalancer_rejects_a_zero_interval() -> None:
    svc = make({"p0": "plan"})
    with pytest.raises(errors.SpecError) as exc:
        rebalance.Rebalancer(svc, RecordingSwapper(), interval_s=0)
    assert exc.value.field == "rebalance_interval_s"


def test_agent_queue_gauge_follows_the_poll() -> None:
    svc = make({"p0": "plan", "e0": "exec"})
    load_planner(svc, 4)
    svc.plan_rebalance()
    reg: prom.CollectorRegistry = svc.registry
    assert reg.get_sample_value(metrics.PLACEMENT_AGENT_QUEUE, {"agent": "planner"}) == 4.0
    assert reg.get_sample_value(metrics.PLACEMENT_AGENT_QUEUE, {"agent": "executor"}) == 0.0


async def test_after_a_move_the_loop_lets_the_queues_settle_before_measuring_again() -> None:
    svc = make({"p0": "plan", **{f"e{i}": "exec" for i in range(6)}})
    for i in range(6):  # one request waiting on every executor engine
        svc.report_load(pb.WorkerLoad(worker_id=f"e{i}", healthy=True, waiting=1))
    load_planner(svc, 12)

    async def sleep(s: float) -> None:
        return None

    loop = rebalance.Rebalancer(svc, RecordingSwapper(), settle_polls=2, sleep=sleep)
    # per-instance: max(12/(1+k), 6/(6-k)) is least at k = 3 (3 vs 2; k = 4 ties at 3, the smaller wins)
    assert await loop.poll_once() == 3
    for i in range(40):
        assign(svc, f"more{i}", "planner")  # planner 52 over 4, executor 3 over 3: imbalanced again
    assert [await loop.poll_once() for _ in range(2)] == [0, 0]
    assert agents_of(svc) == {"executor": 3, "planner": 4}
    assert await loop.poll_once() == 2  # measured again after the settle polls: max(52/6, 3/1)
