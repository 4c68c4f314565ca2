"""FlexMARL micro-batch pipeline: release at the threshold, tails, and the unified update."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from treadle.errors import SpecError
from treadle.policy.flexmarl import pipeline

B = pipeline.AgentBatch
R = pipeline.Release
U = pipeline.Update
Arr = pipeline.Arrival


@pytest.mark.parametrize(
    ("agent", "want"),
    [
        (B("a", 64, ready=15), None),  # below the micro-batch: wait
        (B("a", 64, ready=16), R("a", 16, 0.25)),  # reaches 16: release (the paper: "exceeds")
        (B("a", 64, ready=40), R("a", 16, 0.25)),  # one micro-batch at a time
        (B("a", 64, ready=20, released=56), R("a", 8, 0.125)),  # last one cut to the target
        (B("a", 64, ready=5, released=32, rollout_done=True), R("a", 5, 5 / 64)),  # tail
        (B("a", 64, ready=9, released=64), None),  # target met: extra samples wait for next step
        (B("a", 0, ready=3), None),  # an agent with nothing to train this step
    ],
    ids=["wait", "threshold", "one-at-a-time", "cut-to-target", "tail", "target-met", "no-target"],
)
def test_next_release(agent: pipeline.AgentBatch, want: pipeline.Release | None) -> None:
    assert pipeline.next_release(agent, micro_batch=16) == want


def test_two_agents_full_sequence() -> None:
    agents = [B("core", 64), B("aux", 16)]
    arrivals = [
        Arr("core", 10),  # nothing yet
        Arr("core", 10),  # 20 ready -> core micro-batch 1
        Arr("aux", 12),  # aux below 16
        Arr("core", 30),  # 34 ready -> micro-batches 2 and 3
        Arr("aux", 2, done=True),  # aux done with 14: tail of 14
        Arr("core", 12, done=True),  # 2 + 12 = 14 ready, done: tail of 14
    ]
    decisions, final = pipeline.run_to_completion(agents, arrivals)
    assert decisions == [
        R("core", 16, 0.25),
        R("core", 16, 0.25),
        R("core", 16, 0.25),
        R("aux", 14, 14 / 16),
        R("core", 14, 14 / 64),
        # both ended short: rescale so each gradient is still a mean over what it trained
        U(rescale=(("core", 64 / 62), ("aux", 16 / 14))),
    ]
    assert [a.released for a in final] == [62, 14]


def test_update_waits_for_every_agent() -> None:
    done = B("a", 16, released=16, trained=16)
    assert pipeline.next_update([done, B("b", 16, ready=4, released=12, trained=12)]) is None  # b not done
    assert pipeline.next_update([done, B("b", 16, released=16, trained=0)]) is None  # b's grads not in yet
    assert pipeline.next_update([done, B("b", 16, rollout_done=True)]) == U(rescale=(("a", 1.0),))
    assert pipeline.next_update([]) is None


@settings(derandomize=True)
@given(
    chunks=st.lists(st.integers(1, 30), min_size=1, max_size=12),
    target=st.integers(1, 128),
    micro=st.integers(1, 32),
)
def test_release_invariants(chunks: list[int], target: int, micro: int) -> None:
    arrivals = [Arr("a", c) for c in chunks[:-1]] + [Arr("a", chunks[-1], done=True)]
    decisions, (final,) = pipeline.run_to_completion([B("a", target)], arrivals, micro_batch=micro)
    releases = [d for d in decisions if isinstance(d, pipeline.Release)]
    assert all(r.samples <= micro for r in releases)
    assert sum(r.samples for r in releases) == min(target, sum(chunks))  # nothing lost, never over
    assert all(r.samples == micro for r in releases[:-1]) or sum(chunks) < target  # only the last is short
    assert isinstance(decisions[-1], pipeline.Update)
    assert sum(r.loss_scale for r in releases) * dict(decisions[-1].rescale)["a"] == pytest.approx(1.0)
    assert final.ready == max(0, sum(chunks) - target)


def test_bad_input() -> None:
    with pytest.raises(SpecError) as err:
        pipeline.next_release(B("a", 4), micro_batch=0)
    assert err.value.field == "micro_batch"
    with pytest.raises(SpecError) as err:
        pipeline.next_release(B("a", -1))
    assert err.value.field == "target"
    with pytest.raises(SpecError) as err:
        pipeline.run_to_completion([B("a", 4)], [Arr("zz", 1)])
    assert err.value.field == "arrivals[0].agent_id"
