"""Which running turns a waiting one preempts (Heddle Algorithm 1 over the gate's slots), hand-checked."""

from __future__ import annotations

import pytest

from treadle.errors import SpecError
from treadle.policy import preemption, registry


def q(tid: str, predicted: float, seq: int = 0) -> registry.QueuedTurn:
    return registry.QueuedTurn(tid, seq=seq, turn=0, task="t", predicted_remaining=predicted)


def test_longer_waiting_turn_preempts_the_shortest_running() -> None:
    running = [q("a", 50), q("b", 5, 1), q("c", 20, 2)]
    assert preemption.victims(running, [q("w", 100, 3)], slots=3) == ["b"]
    # two long waiters take the two shortest slots, shortest first
    assert preemption.victims(running, [q("w", 100, 3), q("x", 90, 4)], slots=3) == ["b", "c"]


def test_no_preemption_for_equal_or_shorter_or_within_margin() -> None:
    running = [q("a", 50), q("b", 20, 1)]
    assert preemption.victims(running, [q("w", 20, 2)], slots=2) == []  # ties never preempt
    assert preemption.victims(running, [q("w", 10, 2)], slots=2) == []
    assert preemption.victims(running, [q("w", 24, 2)], slots=2, margin=0.25) == []  # 24 <= 20 * 1.25
    assert preemption.victims(running, [q("w", 26, 2)], slots=2, margin=0.25) == ["b"]


def test_turns_already_stopping_are_not_preempted_twice() -> None:
    running = [q("a", 50), q("b", 5, 1)]
    # b is being preempted for w; w will take its slot, so x (shorter than a) has no victim
    assert preemption.victims(running, [q("w", 100, 2), q("x", 40, 3)], slots=2, stopping={"b"}) == []
    # a second long waiter does preempt the next victim
    assert preemption.victims(running, [q("w", 100, 2), q("x", 90, 3)], slots=2, stopping={"b"}) == ["a"]


def test_free_slot_or_empty_queue_means_no_victim() -> None:
    assert preemption.victims([q("a", 1)], [], slots=1) == []
    assert preemption.victims([], [q("w", 9)], slots=1) == []


@pytest.mark.parametrize(
    ("kwargs", "field"), [({"slots": -1}, "slots"), ({"slots": 1, "margin": -0.1}, "margin")]
)
def test_bad_knobs_name_the_field(kwargs: dict[str, float], field: str) -> None:
    with pytest.raises(SpecError) as err:
        preemption.victims([q("a", 1)], [q("w", 9)], **kwargs)  # type: ignore[arg-type]
    assert err.value.field == field


def test_turns_past_max_progress_keep_their_slots() -> None:
    running = [q("a", 50), q("b", 5, 1), q("c", 20, 2)]
    waiting = [q("w", 100, 3), q("x", 90, 4)]
    progress = {"a": 0.5, "b": 0.9, "c": 0.1}
    # a and b (well into their turns) are not thrown away: c is the only victim, for w
    assert preemption.victims(running, waiting, slots=3, progress=progress, max_progress=0.25) == ["c"]
    # unbounded (the default) is Algorithm 1: b and c
    assert preemption.victims(running, waiting, slots=3, progress=progress) == ["b", "c"]
    # every running turn past the bound: nobody is preempted
    done = dict.fromkeys("abc", 0.5)
    assert preemption.victims(running, waiting, slots=3, progress=done, max_progress=0.25) == []


def test_max_progress_must_not_be_negative() -> None:
    with pytest.raises(SpecError) as err:
        preemption.victims([q("a", 1)], [q("w", 9)], slots=1, progress={}, max_progress=-1.0)
    assert err.value.field == "max_progress"
