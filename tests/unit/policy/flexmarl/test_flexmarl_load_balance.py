"""FlexMARL load balancing: min-heap dispatch, timeouts, and whole rebalancing sequences (lws-style)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from treadle.errors import SpecError
from treadle.policy.flexmarl import load_balance as lb

Inst = lb.Instance


def agent(
    agent_id: str, queue: int, loads: list[int], shape: str = "14b-tp1", version: int = 0
) -> lb.AgentLoad:
    return lb.AgentLoad(
        agent_id, queue, tuple(Inst(f"{agent_id}{k}", x) for k, x in enumerate(loads)), shape, version
    )


def test_dispatch_least_loaded_with_id_ties() -> None:
    got = lb.dispatch(["r1", "r2", "r3", "r4"], [Inst("b", 1), Inst("a", 1), Inst("c", 0)])
    assert got == [
        ("r1", "c"),  # c has 0
        ("r2", "a"),  # a, b, c all at 1: smallest id
        ("r3", "b"),  # a 2, b 1, c 1: b before c by id
        ("r4", "c"),
    ]
    with pytest.raises(SpecError):
        lb.dispatch(["r"], [])


@settings(derandomize=True)
@given(loads=st.lists(st.integers(0, 20), min_size=1, max_size=8), n=st.integers(0, 30))
def test_dispatch_always_picks_a_minimum(loads: list[int], n: int) -> None:
    state = {f"i{k}": x for k, x in enumerate(loads)}
    for _, inst in lb.dispatch([f"r{k}" for k in range(n)], [Inst(k, v) for k, v in state.items()]):
        assert state[inst] == min(state.values())
        state[inst] += 1


def test_expire_requeues_once_then_fails() -> None:
    in_flight = [
        lb.InFlight("r1", "i0", deadline=10.0, attempts=1),
        lb.InFlight("r2", "i0", deadline=5.0, attempts=3),
        lb.InFlight("r3", "i1", deadline=20.0, attempts=1),
    ]
    assert lb.expire(in_flight, now=4.0) is None
    assert lb.expire(in_flight, now=10.0, max_attempts=3) == lb.Expired(
        requeue=("r1",),  # first timeout: back in the queue (the shell dispatches it as attempt 2)
        fail=("r2",),  # third dispatch timed out: given up
        released=(("i0", 2),),  # both leave i0's load
    )


@pytest.mark.parametrize(
    ("agents", "rule", "want_moves", "want_instances"),
    [
        (
            [agent("a", 12, [3, 1, 2]), agent("b", 2, [0, 4, 1])],
            "literal",
            # d = 12 - 2 = 10 > 5: k = min(10, 3 - 1) = 2, b's two least-loaded (b0 load 0, b2 load 1)
            # then b has one instance: the floor stops further moves
            [lb.Rebalance("b", "a", ("b0", "b2"), 0)],
            {"a": 5, "b": 1},
        ),
        (
            [agent("a", 7, [0, 0]), agent("b", 2, [0, 0])],
            "literal",
            [],  # d = 5 is not above delta 5: nothing moves
            {"a": 2, "b": 2},
        ),
        (
            [agent("a", 30, [0]), agent("b", 0, [0, 0, 0]), agent("c", 10, [0, 0, 0])],
            "literal",
            [
                lb.Rebalance("b", "a", ("b0", "b1"), 0),  # lowest queue b gives 2 (floor 1)
                lb.Rebalance("c", "a", ("c0", "c1"), 0),  # then c: 30 - 10 = 20 > 5, gives 2
            ],
            {"a": 5, "b": 1, "c": 1},
        ),
        (
            [agent("a", 40, [0]), agent("b", 0, [0, 0, 0], shape="32b-tp2")],
            "literal",
            [],  # b's instances cannot serve a's model: no compatible donor
            {"a": 1, "b": 3},
        ),
        (
            [agent("a", 40, [0, 0]), agent("b", 4, [0, 0, 0, 0])],
            "per-instance",
            # pressures 20 vs 1: k in 1..3 minimising max(40/(2+k), 4/(4-k)): k=3 gives max(8, 4) = 8
            # then 8 vs 4 is within delta 5: settled
            [lb.Rebalance("b", "a", ("b0", "b1", "b2"), 0)],
            {"a": 5, "b": 1},
        ),
        (
            [agent("a", 24, [0, 0]), agent("b", 2, [0, 0, 0, 0])],
            "per-instance",
            # 12 vs 0.5: k=1 -> max(8, 0.67); k=2 -> max(6, 1); k=3 -> max(4.8, 2): k=3
            [lb.Rebalance("b", "a", ("b0", "b1", "b2"), 0)],
            {"a": 5, "b": 1},
        ),
        (
            [agent("a", 20, [0, 0, 0, 0]), agent("b", 0, [0, 0])],
            "per-instance",
            [],  # pressures 5 vs 0: not above delta 5
            {"a": 4, "b": 2},
        ),
    ],
    ids=[
        "literal-floor",
        "at-threshold",
        "literal-two-donors",
        "shape-mismatch",
        "per-instance",
        "per-instance-2",
        "per-instance-quiet",
    ],
)
def test_rebalance_sequences(
    agents: list[lb.AgentLoad], rule: lb.Rule, want_moves: list[lb.Rebalance], want_instances: dict[str, int]
) -> None:
    moves, final = lb.run_to_completion(agents, rule=rule)
    assert moves == want_moves
    assert {a.agent_id: len(a.instances) for a in final} == want_instances


def test_moved_instances_carry_the_receivers_weights_and_requeue_their_work() -> None:
    agents = [agent("a", 12, [3], version=7), agent("b", 0, [2, 5], version=6)]
    move = lb.rebalance(agents)
    assert move == lb.Rebalance("b", "a", ("b0",), 7)  # b0 loads a's weights at version 7 first
    after = {a.agent_id: a for a in lb.apply(agents, move)}
    assert after["b"].queue_len == 2  # b0's two outstanding requests go back to b's queue
    assert after["a"].instances == (Inst("a0", 3), Inst("b0", 0))  # b0 joins a idle


@settings(derandomize=True, max_examples=500)
@given(
    queues=st.lists(st.integers(0, 60), min_size=1, max_size=5),
    sizes=st.lists(st.integers(1, 5), min_size=5, max_size=5),
    load=st.integers(0, 40),
    rule=st.sampled_from(["literal", "per-instance"]),
)
def test_rebalance_invariants(queues: list[int], sizes: list[int], load: int, rule: lb.Rule) -> None:
    # moved instances hand their outstanding requests back to the donor's queue
    agents = [agent(f"a{k}", q, [load * (i % 2) for i in range(sizes[k])]) for k, q in enumerate(queues)]
    _, final = lb.run_to_completion(agents, rule=rule)
    assert all(len(a.instances) >= 1 for a in final)  # liveness floor
    total = sum(len(a.instances) for a in agents)
    assert sum(len(a.instances) for a in final) == total  # nothing created or lost
    assert len({i.instance_id for a in final for i in a.instances}) == total
    assert lb.rebalance(final, rule=rule) is None  # settled


def test_bad_input() -> None:
    with pytest.raises(SpecError) as err:
        lb.rebalance([agent("a", 1, [])])
    assert err.value.field == "agents[0].instances"
    with pytest.raises(SpecError) as err:
        lb.rebalance([agent("a", 1, [0])], delta=-1)
    assert err.value.field == "delta"
    with pytest.raises(SpecError) as err:
        lb.expire([], now=0, max_attempts=0)
    assert err.value.field == "max_attempts"
