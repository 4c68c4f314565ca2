"""The continuous-batching worker on hand-computed cases (prefill, fluid decode, pause, abort)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from treadle.policy import costmodel
from treadle.sim import cost, entities

ENGINE = cost.Roofline(costmodel.H800, costmodel.QWEN3_8B, 1)


def _worker(max_seqs: int = 8) -> entities.Worker:
    def fifo(q: Sequence[entities.Request]) -> list[entities.Request]:
        return sorted(q, key=lambda r: r.seq)

    return entities.Worker(
        idx=0, worker_id="w0", pool="p", engine=ENGINE, max_seqs=max_seqs, kv_capacity=100_000, order=fifo
    )


def _req(traj: int, new: int, out: int) -> entities.Request:
    return entities.Request(
        traj=traj, new_tokens=new, cached_tokens=0, remaining=float(out), context=new, seq=0
    )


def test_one_request_prefill_then_decode() -> None:
    w = _worker()
    (ev,) = w.submit(_req(1, 1000, 10), 0.0)
    prefill = ENGINE.prefill_batch(flops=ENGINE.prefill_flops(1000, 0), kv_tokens=1000, new_tokens=1000)
    assert ev.time == pytest.approx(prefill)
    done, (ev,) = w.on_event(ev.time)
    assert done == []
    # 10 tokens at batch 1, the step priced at the context when decoding started (1000 tokens)
    assert ev.time == pytest.approx(prefill + 10 * ENGINE.decode_step(1, 1000))
    done, nxt = w.on_event(ev.time)
    assert [r.traj for r in done] == [1] and nxt == [] and w.state == "idle" and w.load == 0


def test_two_requests_share_steps_then_the_longer_runs_alone() -> None:
    w = _worker()
    (ev,) = w.submit(_req(1, 500, 4), 0.0)
    assert w.submit(_req(2, 500, 10), 0.0) == []  # arrives during a prefill: waits for it to land
    p = ENGINE.prefill_batch(flops=ENGINE.prefill_flops(500, 0), kv_tokens=500, new_tokens=500)
    assert ev.time == pytest.approx(p)
    _, (ev,) = w.on_event(ev.time)  # #1 lands; #2's prefill starts (decoding waits, prefill first)
    assert ev.time == pytest.approx(2 * p)
    _, (ev,) = w.on_event(ev.time)
    both = ENGINE.decode_step(2, 1000)  # two sequences, 500 + 500 tokens of context
    assert ev.time == pytest.approx(2 * p + 4 * both)
    done, (ev,) = w.on_event(ev.time)
    assert [r.traj for r in done] == [1]
    # the survivor has 6 tokens left and its context grew by 4 to 504
    assert ev.time == pytest.approx(2 * p + 4 * both + 6 * ENGINE.decode_step(1, 504))
    done, _ = w.on_event(ev.time)
    assert [r.traj for r in done] == [2]


def test_slots_bound_the_batch_and_waiting_turns_queue() -> None:
    w = _worker(max_seqs=1)
    w.submit(_req(1, 100, 5), 0.0)
    w.submit(_req(2, 100, 5), 0.0)
    assert (len(w.pending), len(w.waiting), w.load) == (1, 1, 2)


def test_pause_recomputes_the_context_and_abort_drops_requests() -> None:
    w = _worker()
    (landed,) = w.submit(_req(1, 1000, 100), 0.0)
    _, (ev,) = w.on_event(landed.time)
    mid = (landed.time + ev.time) / 2  # halfway through the decode
    (pause,) = w.pause(mid, 2.0, recompute=True)
    assert pause.time == pytest.approx(mid + 2.0)
    (req,) = w.pending
    assert req.cached_tokens == 0 and req.new_tokens == req.context > 1000  # re-prefill everything
    assert req.remaining == pytest.approx(50, abs=1)  # half the tokens were generated
    (resume,) = w.resume(pause.time)  # starts the recompute prefill
    assert w.state == "prefill"
    assert w.abort({1}, pause.time) == []  # in-flight prefill: dropped when it lands
    done, nxt = w.on_event(resume.time)
    assert done == [] and nxt == [] and w.load == 0


def test_preempt_sends_a_running_request_back_with_its_prefix_cached() -> None:
    w = _worker(max_seqs=2)
    (ev,) = w.submit(_req(1, 1000, 100), 0.0)
    w.submit(_req(2, 1000, 100), 0.0)  # waits for the first prefill to land
    _, (ev,) = w.on_event(ev.time)  # the second one's prefill
    _, (ev,) = w.on_event(ev.time)  # both decoding, 100 tokens each to go
    step = ENGINE.decode_step(2, 2000)
    at = ev.time - 60 * step  # 40 tokens decoded by then
    (fresh,), evs = w.preempt({2}, at)
    assert [r.traj for r in w.running()] == [1]
    assert fresh.new_tokens == 0 and fresh.cached_tokens == fresh.context == 1040
    assert fresh.remaining == pytest.approx(60)
    # the slot it freed is taken back at once (nothing else waits): a zero-length prefill, no recompute
    (ev,) = evs
    assert ev.time == pytest.approx(at) and w.state == "prefill" and w.pending == [fresh]
    assert w.preempt({7}, at) == ([], [])


def test_preempt_while_prefilling_waits_for_the_prefill() -> None:
    w = _worker(max_seqs=1)
    (ev,) = w.submit(_req(1, 500, 10), 0.0)
    _, (ev,) = w.on_event(ev.time)
    w.submit(_req(2, 500, 10), ev.time / 2)  # waits: no slot
    fresh, evs = w.preempt({1}, ev.time / 2)
    assert [r.traj for r in fresh] == [1] and len(evs) == 1 and w.state == "prefill"
