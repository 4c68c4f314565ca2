"""The buffer's pipeline state makes exactly the policy's decisions (treadle.policy.flexmarl.pipeline)."""

from __future__ import annotations

import pytest

from treadle import errors
from treadle.policy.flexmarl import pipeline as policy
from treadle.services.buffer import pipeline


def replay(state: pipeline.MicroBatchPipeline, arrivals: list[policy.Arrival], micro: int) -> list[object]:
    """Feed arrivals through the buffer's state as the service does (instant training = ack)."""
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
                state.released(agent, batch_id=f"{agent}-{n}-{len(out)}", samples=release.samples)
                state.acked(f"{agent}-{n}-{len(out)}", release.samples)
                out.append(release)
    update = state.try_update()
    if update is not None:
        out.append(update)
    return out


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
    assert replay(state, arrivals, 16) == expected
    assert state.step == 1 and not state.states


def test_the_update_waits_for_every_configured_agent() -> None:
    state = pipeline.MicroBatchPipeline(["a", "b"])
    state.begin("a", target=2)
    release = state.next_release("a", ready=2, micro_batch=2)
    assert release is not None
    state.released("a", batch_id="x", samples=2)
    state.acked("x", 2)
    assert state.try_update() is None  # b has not streamed this step
    assert state.update_for("a") == (0, None)


def test_a_second_stream_with_another_target_is_refused() -> None:
    state = pipeline.MicroBatchPipeline()
    state.begin("a", target=4)
    with pytest.raises(errors.Conflict, match="batch_size 4, not 8"):
        state.begin("a", target=8)
