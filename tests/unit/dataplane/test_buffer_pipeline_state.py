"""The buffer's pipeline state makes exactly the policy's decisions (treadle.policy.flexmarl.pipeline)."""

from __future__ import annotations

import pytest

from treadle import errors
from treadle.policy.flexmarl import pipeline as policy
from treadle.services.buffer import pipeline


def replay(
    state: pipeline.MicroBatchPipeline, arrivals: list[policy.Arrival], micro: int
) -> tuple[list[object], pipeline.MicroBatchPipeline]:
    """Feed arrivals through the buffer's state as the service does (instant training = ack), reloading
    it from its stored form after every release as a restarted buffer would."""
    ready: dict[str, int] = {}
    out: list[object] = []
    for n, arrival in enumerate(arrivals):
        ready[arrival.agent_id] = ready.get(arrival.agent_id, 0) + arrival.samples
        if arrival.done:
            state.rollout_done(arrival.agent_id)
        for agent in sorted(state.states):
            while (
                release := state.next_release(agent, ready=ready.get(agent, 0), micro_batch=micro)
            ) is not None:
                ready[agent] -= release.samples
                bid = f"{agent}-{n}-{len(out)}"
                state.released(agent, batch_id=bid, samples=release.samples, deadline=10.0)
                state = pipeline.load(state.dump(), agents=state.agents)  # what a restarted buffer reads
                state.acked(bid)
                out.append(release)
    update = state.try_update()
    if update is not None:
        out.append(update)
    return out, state


@pytest.mark.parametrize(
    "arrivals",
    [
        # both agents fill their targets in micro-batches of 16
        [policy.Arrival("a", 40), policy.Arrival("b", 64), policy.Arrival("a", 24)],
        # agent b ends short: its tail goes out and its update is rescaled
        [policy.Arrival("a", 64), policy.Arrival("b", 20, done=True)],
    ],
    ids=["full", "short-tail"],
)
def test_same_decisions_as_the_policy(arrivals: list[policy.Arrival]) -> None:
    state = pipeline.MicroBatchPipeline(["a", "b"])
    for agent in ("a", "b"):
        state.begin(agent, target=64)
    expected, _ = policy.run_to_completion(
        [policy.AgentBatch("a", 64), policy.AgentBatch("b", 64)], arrivals, micro_batch=16
    )
    decisions, state = replay(state, arrivals, 16)
    assert decisions == expected
    assert state.step == 1 and not state.states


def test_the_update_waits_for_every_configured_agent() -> None:
    state = pipeline.MicroBatchPipeline(["a", "b"])
    state.begin("a", target=2)
    release = state.next_release("a", ready=2, micro_batch=2)
    assert release is not None
    state.released("a", batch_id="x", samples=2, deadline=10.0)
    state.acked("x")
    assert state.try_update() is None  # b has not streamed this step
    assert state.update_for("a") == (0, None)


def test_a_second_stream_with_another_target_is_refused() -> None:
    state = pipeline.MicroBatchPipeline()
    state.begin("a", target=4)
    with pytest.raises(errors.Conflict, match="batch_size 4, not 8"):
        state.begin("a", target=8)


def test_the_stored_state_round_trips() -> None:
    state = pipeline.MicroBatchPipeline(["a", "b"])
    state.begin("a", target=4)
    state.begin("b", target=4)
    state.released("a", batch_id="a0", samples=2, deadline=5.5)
    state.acked("a0")
    state.released("a", batch_id="a1", samples=2, deadline=7.25)
    state.rollout_done("b")
    assert state.try_update() is None
    again = pipeline.load(state.dump(), agents=("a", "b"))
    assert again.dump() == state.dump()
    assert (again.step, again.states, again.agent_step, again.batches) == (
        0,
        state.states,
        {"a": 0, "b": 0},
        {"a1": pipeline.Outstanding("a", 2, 7.25)},
    )
    again.acked("a1")
    update = again.try_update()
    assert update == policy.Update(rescale=(("a", 1.0),))
    closed = pipeline.load(again.dump(), agents=("a", "b"))
    assert closed.step == 1 and not closed.states and closed.update_for("b") == (0, update)


def test_an_expired_release_is_unreleased_and_its_late_ack_ignored() -> None:
    state = pipeline.MicroBatchPipeline()
    state.begin("a", target=4)
    state.released("a", batch_id="x", samples=2, deadline=10.0)
    state.released("a", batch_id="y", samples=2, deadline=20.0)
    assert not state.expire(9.9)
    assert state.expire(10.0)
    assert state.states["a"].released == 2 and set(state.batches) == {"y"}
    state.acked("x")  # the store refuses this ack; the pipeline must not count it either
    assert state.states["a"].trained == 0


def test_a_stream_still_open_when_its_step_closed_gets_nothing_more() -> None:
    state = pipeline.MicroBatchPipeline(["a"])
    state.begin("a", target=16)
    release = state.next_release("a", ready=16, micro_batch=16)
    assert release is not None
    state.released("a", batch_id="b0", samples=release.samples, deadline=10.0)
    state.acked("b0")
    assert state.try_update() is not None  # the last ack closed the step
    # What a second stream of the same trainer (or the first, before it saw the close) does next:
    assert state.next_release("a", ready=32, micro_batch=16) is None
    state.rollout_done("a")
    assert state.finished("a") and not state.states and state.step == 1
