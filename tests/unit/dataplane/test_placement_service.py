"""Placement service: worker registry, affinity over pools, stickiness, migration and bad input."""

from __future__ import annotations

import pytest

from treadle import errors
from treadle.api import jobconfig
from treadle.services.placement import protocol as placement_protocol
from treadle.services.placement import service
from treadle.v1 import placement_pb2 as pb

POOLS = {"h800": "prefill-heavy", "h20": "decode-heavy"}


def make(**tasks: jobconfig.TaskPlacement) -> service.PlacementService:
    svc = service.PlacementService(
        pools=POOLS, tasks=tasks or {"math": jobconfig.TaskPlacement("decode-heavy")}
    )
    for wid, pool in [("a", "h800"), ("b", "h20"), ("c", "h20")]:
        svc.register_worker(pb.Worker(worker_id=wid, pool=pool, address=f"http://{wid}"))
    return svc


def assign(svc: service.PlacementService, tid: str, task: str = "math") -> str:
    return str(svc.assign(placement_protocol.AssignRequest(trajectory_id=tid, task=task)).worker_id)


def test_affinity_then_least_loaded_then_sticky() -> None:
    svc = make()
    assert [assign(svc, "t1"), assign(svc, "t2")] == ["b", "c"]  # decode-heavy pool only, spread
    svc.release(
        placement_protocol.ReleaseRequest(trajectory_id="t1", worker_id="b", task="math", turn_finished=True)
    )
    assert assign(svc, "t1") == "b"  # sticky
    reply = svc.assign(placement_protocol.AssignRequest(trajectory_id="t3", task="math"))
    assert (reply.address, reply.pool, reply.reason, reply.work) == (
        "http://b",
        "h20",
        "least-loaded",
        "decode-heavy",
    )


def test_reported_load_counts_when_higher_than_outstanding() -> None:
    svc = make()
    svc.report_load(pb.WorkerLoad(worker_id="b", running=10, waiting=5, kv_cache_usage=0.5, healthy=True))
    assert assign(svc, "t1") == "c"
    svc.report_load(pb.WorkerLoad(worker_id="c", running=0, waiting=0, healthy=False))
    assert assign(svc, "t2") == "b"  # c is unhealthy; b is the only decode-heavy worker left


def test_migrate_drains_a_worker_and_moves_its_trajectories() -> None:
    svc = make()
    assert assign(svc, "t1") == "b"
    assert svc.migrate("b") == 1
    assert assign(svc, "t1") == "c"
    svc.register_worker(pb.Worker(worker_id="b", pool="h20", address="http://b"))  # back from drain
    state = {w.worker.worker_id: w for w in svc.pool_state().workers}
    assert state["b"].load.healthy and state["c"].sticky_trajectories == 1


def test_no_worker_is_unavailable() -> None:
    svc = service.PlacementService(pools=POOLS, tasks={"math": jobconfig.TaskPlacement("decode-heavy")})
    with pytest.raises(errors.Unavailable):
        assign(svc, "t1")


def test_auto_affinity_uses_the_measured_profile() -> None:
    svc = make(chat=jobconfig.TaskPlacement("auto"))
    assert svc.pool_state().tasks[0].work == "decode-heavy"  # no profile yet: the documented default
    for i in range(8):  # long prompts, one short answer: prefill-heavy by the cost model
        tid = f"t{i}"
        worker = assign(svc, tid, "chat")
        svc.release(placement_protocol.ReleaseRequest(
            trajectory_id=tid, worker_id=worker, task="chat", turn_finished=True, prompt_tokens=30_000,
            output_tokens=8,
        ))  # fmt: skip
        svc.release(placement_protocol.ReleaseRequest(trajectory_id=tid, task="chat", final=True, turns=1))
    task = svc.pool_state().tasks[0]
    assert (task.trajectories, task.mean_prompt_tokens, task.work) == (8, 30_000, "prefill-heavy")
    assert assign(svc, "next", "chat") == "a"


SE, NF = errors.SpecError, errors.NotFound
BAD_CALLS = {
    "unknown-pool": (
        lambda s: s.register_worker(pb.Worker(worker_id="x", pool="nope", address="a")),
        SE,
        "pool",
    ),
    "no-worker-id": (
        lambda s: s.register_worker(pb.Worker(worker_id="", pool="h20", address="a")),
        SE,
        "worker_id",
    ),
    "unknown-task": (
        lambda s: s.assign(placement_protocol.AssignRequest(trajectory_id="t", task="nope")),
        SE,
        "task",
    ),
    "no-trajectory": (
        lambda s: s.assign(placement_protocol.AssignRequest(trajectory_id="", task="math")),
        SE,
        "trajectory_id",
    ),
    "unknown-worker-load": (lambda s: s.report_load(pb.WorkerLoad(worker_id="zz")), NF, None),
    "kv-out-of-range": (
        lambda s: s.report_load(pb.WorkerLoad(worker_id="b", kv_cache_usage=2)),
        SE,
        "kv_cache_usage",
    ),
    "empty-release": (
        lambda s: s.release(placement_protocol.ReleaseRequest(trajectory_id="t", task="math")),
        SE,
        "turn_finished",
    ),
    "unknown-worker-release": (
        lambda s: s.release(
            placement_protocol.ReleaseRequest(
                trajectory_id="t", worker_id="zz", task="math", turn_finished=True
            )
        ),
        NF,
        None,
    ),
    "unknown-worker-migrate": (lambda s: s.migrate("zz"), NF, None),
}


@pytest.mark.parametrize(("call", "error", "field"), list(BAD_CALLS.values()), ids=list(BAD_CALLS))
def test_bad_input_is_rejected_and_changes_nothing(
    call: object, error: type[Exception], field: str | None
) -> None:
    svc = make()
    before = svc.pool_state()
    with pytest.raises(error) as err:
        call(svc)  # type: ignore[operator]
    if field is not None:
        assert getattr(err.value, "field", None) == field
    assert svc.pool_state() == before


def test_bad_configuration_names_the_field() -> None:
    with pytest.raises(errors.SpecError) as err:
        service.PlacementService(
            pools=POOLS, tasks={"m": jobconfig.TaskPlacement("decode-heavy", pools=["x"])}
        )
    assert err.value.field == "tasks.m.pools"
    with pytest.raises(errors.SpecError) as policy:
        service.PlacementService(pools=POOLS, tasks={}, policy="random")
    assert policy.value.field == "rollout.placementPolicy"
