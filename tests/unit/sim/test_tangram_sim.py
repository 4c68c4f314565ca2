"""The ``tangram`` simulator: every action accounted for, capacity respected, the policy code used."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from treadle.policy.tangram import buddy, schedule
from treadle.sim import tangram, workloads

D = workloads.Dist
CODING = tangram.Coding(
    batch=24,
    nodes=1,
    cores_per_node=16,
    turns=D("lognormal", 4, cv=0.5, low=1, high=10),
    gen_s=D("lognormal", 1.0, cv=0.5),
    tool_s=D("lognormal", 0.5, cv=1.0, low=0.001, high=5),
    reward_s=D("lognormal", 10.0, cv=0.8, low=1, high=60),
    serial=0.05,
    max_dop=16,
)
MOPD = tangram.Mopd(
    batch=48,
    nodes=1,
    services=3,
    static_gpus=2,
    gen_s=D("lognormal", 5.0, cv=0.8),
    reward_s=D("lognormal", 2.0, cv=0.5, low=0.1, high=10),
    serial=0.1,
)


@pytest.mark.parametrize("system", tangram.CODING_SYSTEMS)
def test_every_coding_action_ends_after_it_starts(system: str) -> None:
    result = tangram.run_coding(CODING, system)
    assert result.stage_s["tool"] > 0 and result.stage_s["reward"] > 0
    for kind, parts in result.breakdown.items():
        assert parts["queue_s"] >= 0 and parts["exec_s"] > 0 and parts["overhead_s"] > 0, kind
    assert 0 < result.busy_fraction < 1
    again = tangram.run_coding(CODING, system)  # seeded: the same run twice, but for the wall clock
    assert dataclasses.replace(result, decision_ms=0) == dataclasses.replace(again, decision_ms=0)


def test_tangram_never_grants_more_cores_than_are_free(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real_decide = schedule.decide
    real_start = tangram.CpuTangram._start

    def decide(*args: Any, **kwargs: Any) -> list[Any]:
        calls.append(1)
        return real_decide(*args, **kwargs)

    def start(self: Any, node: int, action: Any, job: Any, rec: Any, units: int) -> None:
        assert 1 <= units <= self.free[node]
        real_start(self, node, action, job, rec, units)

    monkeypatch.setattr(schedule, "decide", decide)
    monkeypatch.setattr(tangram.CpuTangram, "_start", start)
    tangram.run_coding(dataclasses.replace(CODING, batch=64), "tangram")
    assert calls  # the simulator runs the policy's Alg. 1, not a copy


def test_k8s_pods_time_out_and_are_requested_again() -> None:
    slow = dataclasses.replace(CODING, pods_per_s=0.5, pod_timeout_s=10.0)
    result = tangram.run_coding(slow, "k8s")
    assert result.timeouts > 0
    assert (
        result.breakdown["tool"]["queue_s"] > tangram.run_coding(CODING, "k8s").breakdown["tool"]["queue_s"]
    )


def test_one_action_per_gpu_and_buddy_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    held: set[tuple[int, int]] = set()
    real_allocate, real_release = buddy.allocate, buddy.release

    def allocate(pool: buddy.Pool, units: int, service: str, gb: float) -> Any:
        got = real_allocate(pool, units, service, gb)
        assert got is not None
        c = got[1].chunk
        cells = {(c.node, g) for g in range(c.start, c.end)}
        assert not cells & held and c.start % c.size == 0
        held.update(cells)
        return got

    def release(pool: buddy.Pool, chunk: buddy.Chunk) -> buddy.Pool:
        held.difference_update((chunk.node, g) for g in range(chunk.start, chunk.end))
        return real_release(pool, chunk)

    monkeypatch.setattr(buddy, "allocate", allocate)
    monkeypatch.setattr(buddy, "release", release)
    result = tangram.run_mopd(MOPD, "tangram")
    assert result.restores > 0 and not held
    assert result.breakdown["reward"]["overhead_s"] > MOPD.overhead_s  # restores cost time


def test_static_serving_queues_per_teacher() -> None:
    result = tangram.run_mopd(MOPD, "static")
    assert result.restores == 0 and result.breakdown["reward"]["overhead_s"] == pytest.approx(MOPD.overhead_s)


def test_unknown_systems_name_the_flag() -> None:
    for run, cfg in ((tangram.run_coding, CODING), (tangram.run_mopd, MOPD)):
        with pytest.raises(Exception) as info:
            run(cfg, "nope")  # type: ignore[operator]
        assert getattr(info.value, "field", None) == "--runs"
