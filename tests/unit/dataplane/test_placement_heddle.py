"""Placement under ``heddle``: batch placement by presorted DP, strict routing, migration at a tool call."""

from __future__ import annotations

import pytest

from treadle import errors
from treadle.api import jobconfig
from treadle.services.placement import protocol as placement_protocol
from treadle.services.placement import service
from treadle.v1 import placement_pb2 as pb


def make() -> service.PlacementService:
    svc = service.PlacementService(
        pools={"p": "decode-heavy"}, tasks={"math": jobconfig.TaskPlacement("decode-heavy")}, policy="heddle"
    )
    for wid in ("w0", "w1"):
        svc.register_worker(pb.Worker(worker_id=wid, pool="p", address=f"http://{wid}"))
    return svc


def place(
    svc: service.PlacementService,
    predictions: dict[str, float],
    *,
    worker_slots: int = 0,
    gate: int = 0,
) -> int:
    candidates = tuple(placement_protocol.Candidate(tid, "math", p) for tid, p in predictions.items())
    return svc.place_batch(
        placement_protocol.PlaceBatchRequest(candidates, worker_slots=worker_slots, gate=gate)
    )


def assign(svc: service.PlacementService, tid: str) -> tuple[str, str]:
    a = svc.assign(placement_protocol.AssignRequest(trajectory_id=tid, task="math"))
    return a.worker_id, a.reason


def step(svc: service.PlacementService, tid: str, worker: str, predicted: float) -> None:
    req = placement_protocol.ReleaseRequest(
        trajectory_id=tid, worker_id=worker, task="math", turn_finished=True, predicted_remaining=predicted,
        context_tokens=40,
    )  # fmt: skip
    svc.release(req)


def test_batch_is_split_by_the_dp_and_every_turn_routed() -> None:
    svc = make()
    assert place(svc, {f"t{i}": 10.0 for i in range(4)}) == 4
    # equal predictions: the DP balances 2 + 2 in presorted (id) order
    assert [assign(svc, f"t{i}") for i in range(4)] == [
        ("w0", "routed"), ("w0", "routed"), ("w1", "routed"), ("w1", "routed"),
    ]  # fmt: skip
    # routing is strict: load does not move a routed trajectory
    assert assign(svc, "t0") == ("w0", "routed")


def test_a_trajectory_that_becomes_the_longest_migrates_during_its_tool_call() -> None:
    svc = make()
    place(svc, {f"t{i}": 10.0 for i in range(4)})
    for i in range(4):
        assign(svc, f"t{i}")
    step(svc, "t3", "w1", 500.0)  # now ranked first: its rank falls in w0's interval
    state = svc.pool_state()
    assert state.migrations == 1
    assert assign(svc, "t3") == ("w0", "migrated")  # the move completes with this turn (re-prefill)
    assert assign(svc, "t3") == ("w0", "routed")
    # Re-planned at each step: t3 (500) alone costs 500, the other three together 10 * I(3) = 11, so
    # the DP gives t3 worker w0 alone (capacities 1, 3) and t0 moves off it at its tool call.
    step(svc, "t0", "w0", 10.0)
    assert svc.pool_state().migrations == 2
    assert assign(svc, "t0") == ("w1", "migrated")
    step(svc, "t1", "w0", 10.0)
    assert assign(svc, "t1") == ("w1", "migrated")
    step(svc, "t2", "w1", 10.0)  # already on w1: stays
    assert assign(svc, "t2") == ("w1", "routed") and svc.pool_state().migrations == 3


def test_transmission_scheduler_keeps_one_move_per_worker_in_transit() -> None:
    svc = make()
    place(svc, {f"t{i}": 10.0 for i in range(4)})
    for i in range(4):
        assign(svc, f"t{i}")
    step(svc, "t3", "w1", 500.0)  # w1 -> w0 in transit until t3's next turn
    step(svc, "t2", "w1", 400.0)  # would also go w1 -> w0: both endpoints busy, so it stays
    assert svc.pool_state().migrations == 1
    assert assign(svc, "t2") == ("w1", "routed")


def test_unplaced_trajectory_is_placed_at_its_first_turn_and_final_forgets_it() -> None:
    svc = make()
    worker, reason = assign(svc, "solo")
    assert reason == "routed" and worker in {"w0", "w1"}
    svc.release(placement_protocol.ReleaseRequest(trajectory_id="solo", task="math", final=True, turns=1))
    svc.report_load(pb.WorkerLoad(worker_id=worker, healthy=False))
    other = ({"w0", "w1"} - {worker}).pop()
    assert assign(svc, "solo") == (other, "routed")  # placed again, on the healthy worker


def test_unhealthy_routed_worker_falls_back_to_sticky_least_loaded() -> None:
    svc = make()
    place(svc, {"t0": 10.0, "t1": 10.0})
    assert assign(svc, "t0") == ("w0", "routed")
    svc.report_load(pb.WorkerLoad(worker_id="w0", healthy=False))
    assert assign(svc, "t0") == ("w1", "least-loaded")


@pytest.mark.parametrize(("worker_slots", "on_w0"), [(0, 1), (2, 3)], ids=["no-gate", "two-slots"])
def test_dp_prices_the_per_worker_slots_the_scheduler_reports(worker_slots: int, on_w0: int) -> None:
    # the hand-checked case of tests/unit/policy/test_placement_heddle_slots.py: 2 slots per worker
    # turn the slot-blind (1, 5) split into (3, 3)
    svc = make()
    place(svc, {"t0": 10.0, **{f"t{i}": 6.0 for i in range(1, 6)}}, worker_slots=worker_slots)
    workers = [assign(svc, f"t{i}")[0] for i in range(6)]
    assert workers == ["w0"] * on_w0 + ["w1"] * (6 - on_w0)


@pytest.mark.parametrize(("gate", "apart"), [(0, False), (4, True)], ids=["no-gate", "gate-4"])
def test_the_scheduler_gate_caps_the_fallback_fluid_model(gate: int, apart: bool) -> None:
    # 2 long and 40 short (tests/unit/policy/heddle/test_heddle_fallback.py's shape): without a gate
    # the DP's plan (the long pair alone on w0) is kept and routes them; a gate of 4 runs the 40
    # short ones 4 at a time, so a balanced plan is predicted sooner: the task falls back to sticky
    # least-loaded, which sends the second long one to the idle worker
    svc = make()
    place(svc, {"t0": 100.0, "t1": 100.0, **{f"t{i}": 10.0 for i in range(2, 42)}}, gate=gate)
    first, second = assign(svc, "t0"), assign(svc, "t1")
    assert (first[0] != second[0]) is apart
    assert {first[1], second[1]} == ({"least-loaded"} if apart else {"routed"})


def test_negative_worker_slots_name_the_field() -> None:
    with pytest.raises(errors.SpecError) as err:
        place(make(), {"t0": 1.0}, worker_slots=-1)
    assert err.value.field == "worker_slots"
    with pytest.raises(errors.SpecError) as err:
        place(make(), {"t0": 1.0}, gate=-1)
    assert err.value.field == "gate"


@pytest.mark.parametrize(
    ("candidate", "field"),
    [
        ({"trajectory_id": "", "task": "math"}, "trajectories[0].trajectory_id"),
        ({"trajectory_id": "t", "task": "nope"}, "trajectories[0].task"),
        ({"trajectory_id": "t", "task": "math", "predicted_remaining": -1.0},
         "trajectories[0].predicted_remaining"),
        ({"trajectory_id": "t", "task": "math", "predicted_remaining": float("nan")},
         "trajectories[0].predicted_remaining"),
    ],
    ids=["empty-id", "unknown-task", "negative", "nan"],
)  # fmt: skip
def test_bad_batch_names_the_field_and_places_nothing(candidate: dict[str, object], field: str) -> None:
    svc = make()
    req = placement_protocol.PlaceBatchRequest((placement_protocol.Candidate(**candidate),))  # type: ignore[arg-type]
    with pytest.raises(errors.SpecError) as err:
        svc.place_batch(req)
    assert err.value.field == field
    assert place(svc, {}) == 0 and svc.pool_state().migrations == 0


def test_per_turn_policies_ignore_place_batch() -> None:
    svc = service.PlacementService(
        pools={"p": "decode-heavy"}, tasks={"math": jobconfig.TaskPlacement("decode-heavy")}
    )
    svc.register_worker(pb.Worker(worker_id="w0", pool="p", address="http://w0"))
    assert place(svc, {"t0": 5.0}) == 0
    assert assign(svc, "t0") == ("w0", "least-loaded")
