"""The scheduler's gate alone: policy order of waiting turns, preemption (and its progress bound) and
per-worker slots. The gate inside the whole scheduler is in test_scheduler."""

from __future__ import annotations

import asyncio

import pytest

from treadle import errors
from treadle.policy import registry
from treadle.services.scheduler import gate as scheduler_gate


def test_gate_orders_waiters_by_policy() -> None:
    async def scenario() -> list[str]:
        gate = scheduler_gate.Gate(1, registry.scheduling_policy("progressive-priority"))
        await gate.acquire("first", turn=0, task="m")
        order: list[str] = []

        async def wait(tid: str, turn: int) -> None:
            await gate.acquire(tid, turn=turn, task="m")
            order.append(tid)
            gate.release(tid)

        waiters = [asyncio.create_task(wait(tid, turn)) for tid, turn in [("a", 0), ("b", 3), ("c", 1)]]
        await asyncio.sleep(0)  # let every waiter queue
        gate.release("first")
        await asyncio.gather(*waiters)
        return order

    assert asyncio.run(scenario()) == ["b", "c", "a"]  # most turns first, FIFO among equals


def test_preemptive_gate_aborts_the_lowest_ranked_running_turn() -> None:
    async def scenario() -> tuple[list[str], list[str]]:
        preempted: list[str] = []
        gate = scheduler_gate.Gate(2, registry.scheduling_policy("heddle"), preempt=preempted.append)
        await gate.acquire("short", turn=0, task="m", predicted_remaining=5.0)
        await gate.acquire("mid", turn=0, task="m", predicted_remaining=50.0)
        order: list[str] = []

        async def wait(tid: str, predicted: float) -> None:
            await gate.acquire(tid, turn=1, task="m", predicted_remaining=predicted)
            order.append(tid)

        long = asyncio.create_task(wait("long", 500.0))
        tiny = asyncio.create_task(wait("tiny", 1.0))
        await asyncio.sleep(0)  # both queue; long outranks "short", tiny outranks nobody
        assert preempted == ["short"] and gate.state("short") == "generating"
        gate.release("short")  # its aborted generation came back: the slot goes to "long"
        await long
        assert gate.state("long") == "generating" and gate.state("tiny") == "waiting"
        gate.release("mid")
        await tiny
        return preempted, order

    assert asyncio.run(scenario()) == (["short"], ["long", "tiny"])


def test_preemptive_gate_spares_a_turn_past_max_progress() -> None:
    async def scenario() -> list[str]:
        now = [0.0]
        preempted: list[str] = []
        gate = scheduler_gate.Gate(
            1, registry.scheduling_policy("heddle"), preempt=preempted.append, max_progress=0.25,
            clock=lambda: now[0],
        )  # fmt: skip
        await gate.acquire("first", turn=0, task="m", predicted_remaining=5.0)
        now[0] = 10.0
        gate.release("first")  # a typical turn is now 10 s
        await gate.acquire("short", turn=0, task="m", predicted_remaining=5.0)
        now[0] = 13.0  # 30 % through its turn: past the bound
        long = asyncio.create_task(gate.acquire("long", turn=1, task="m", predicted_remaining=500.0))
        await asyncio.sleep(0)
        assert preempted == [] and gate.state("long") == "waiting"
        gate.release("short")
        await long
        now[0] = 14.0
        late = asyncio.create_task(gate.acquire("later", turn=1, task="m", predicted_remaining=900.0))
        await asyncio.sleep(0)  # "long" is 10 % through: cheap to throw away, so it is preempted
        assert preempted == ["long"]
        gate.release("long")
        await late
        return preempted

    assert asyncio.run(scenario()) == ["long"]


def test_negative_max_progress_names_the_setting() -> None:
    with pytest.raises(errors.SpecError) as err:
        scheduler_gate.Gate(1, registry.scheduling_policy("heddle"), max_progress=-0.5)
    assert err.value.field == "preemption_max_progress"


def test_gate_counts_slots_per_worker_key() -> None:
    async def scenario() -> list[str]:
        gate = scheduler_gate.Gate(1, registry.scheduling_policy("fifo"))
        await gate.acquire("a", turn=0, task="m", key="w0")
        await gate.acquire("b", turn=0, task="m", key="w1")  # another worker: its own slot
        c = asyncio.create_task(gate.acquire("c", turn=0, task="m", key="w0"))
        await asyncio.sleep(0)
        states = [gate.state("c")]
        gate.release("b")  # frees w1, not w0
        await asyncio.sleep(0)
        states.append(gate.state("c"))
        gate.release("a")
        await c
        states.append(gate.state("c"))
        return states

    assert asyncio.run(scenario()) == ["waiting", "waiting", "generating"]
