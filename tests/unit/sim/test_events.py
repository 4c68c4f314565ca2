"""The event order: (time, kind order, push order) -- pinned, since every result depends on it."""

from __future__ import annotations

from treadle.sim import events

K = events.Kind


def test_same_time_events_run_in_kind_order_then_push_order() -> None:
    q = events.Queue()
    pushed = [
        events.Event(1.0, K.GET_BATCH, 1),
        events.Event(1.0, K.WORKER, 2),
        events.Event(0.5, K.ADMIT, 3),
        events.Event(1.0, K.REWARD_DONE, 4),
        events.Event(1.0, K.WORKER, 5),  # same time and kind as #2: pushed later, runs later
        events.Event(1.0, K.TOOL_DONE, 6),
    ]
    q.push_all(pushed)
    order = [q.pop().subject for _ in range(len(pushed))]
    assert order == [
        3,  # earliest time wins whatever its kind
        2,  # at t=1: worker completions first (they free slots) ...
        5,  # ... in push order among equals
        6,  # then environment steps
        4,  # then scores
        1,  # the trainer's get_batch last, so it sees every score of this instant
    ]


def test_queues_do_not_share_sequence_numbers() -> None:
    # a per-run counter: a second run in the same process orders exactly like the first
    runs = []
    for _ in range(2):
        q = events.Queue()
        q.push_all([events.Event(0.0, K.WORKER, i) for i in range(5)])
        runs.append([q.pop().subject for _ in range(5)])
    assert runs[0] == runs[1] == [0, 1, 2, 3, 4]
