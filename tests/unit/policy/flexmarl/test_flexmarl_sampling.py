"""FlexMARL parallel sampling: admission, top-ups, dependency-driven follow-ups, serial baseline."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from treadle.errors import SpecError
from treadle.policy.flexmarl import sampling

Q = sampling.Query
Req = sampling.Request


def chain(*agents: str) -> dict[str, str | None]:
    """A linear workflow: each agent hands to the next, the last is terminal."""
    return {a: (agents[i + 1] if i + 1 < len(agents) else None) for i, a in enumerate(agents)}


def test_sample_id_format() -> None:
    assert Req("planner", "17", 2, 5).sample_id == "17_2_5"


@pytest.mark.parametrize(
    ("queries", "pending", "cfg", "want_admit", "want_new"),
    [
        # nothing in flight: admit 2 queries (P_inter 2), each starts min(P_intra, samples) = 3
        ([], ["q1", "q2", "q3"], sampling.Config("a", 2, 3, 4), ("q1", "q2"), 6),
        # q1: 4 started, 1 finished, so 3 running: all 4 samples started, nothing new
        ([Q("q1", 4, 1)], [], sampling.Config("a", 2, 3, 4), (), 0),
        # q1: 2 started and finished, 0 running: P_intra allows 3 but only 2 samples remain
        ([Q("q1", 2, 2)], [], sampling.Config("a", 1, 3, 4), (), 2),
        # a complete query frees its slot for a pending one
        ([Q("q1", 4, 4)], ["q2"], sampling.Config("a", 1, 3, 4), ("q2",), 3),
    ],
    ids=["admit", "no-samples-left", "top-up", "slot-freed"],
)
def test_next_requests(
    queries: list[sampling.Query],
    pending: list[str],
    cfg: sampling.Config,
    want_admit: tuple[str, ...],
    want_new: int,
) -> None:
    start = sampling.next_requests(queries, pending, cfg)
    if not want_admit and not want_new:
        assert start is None
        return
    assert start is not None
    assert start.admit == want_admit
    assert len(start.requests) == want_new
    assert all(r.agent_id == "a" and r.turn == 1 for r in start.requests)
    assert len({r.sample_id for r in start.requests}) == want_new  # unique ids


def test_output_dispatches_downstream_at_once() -> None:
    r = Req("router", "q1", 1, 3)
    assert sampling.on_output(r, "coder") == Req("coder", "q1", 2, 3)
    assert sampling.on_output(r, None) is None


def test_parallel_versus_serial_waves() -> None:
    flow = chain("router", "coder", "reviewer")  # three agent calls per sample
    parallel = sampling.Config("router", inter_query=4, intra_query=16, samples_per_query=16)
    serial = sampling.Config("router", inter_query=1, intra_query=1, samples_per_query=16)
    queries = [f"q{i}" for i in range(4)]
    fast = sampling.run_to_completion(queries, parallel, next_agent=lambda r: flow[r.agent_id])
    slow = sampling.run_to_completion(queries, serial, next_agent=lambda r: flow[r.agent_id])
    # every query and sample in flight at once: 3 waves of 64; serially 4 · 16 · 3 = 192 waves of 1
    assert [len(w) for w in fast] == [64, 64, 64]
    assert len(slow) == 192 and all(len(w) == 1 for w in slow)
    # each sample visits every agent once, in order, under both
    for waves in (fast, slow):
        visits = [r for w in waves for r in w]
        assert len(visits) == 4 * 16 * 3
        assert len({r.sample_id for r in visits}) == len(visits)


@settings(derandomize=True)
@given(
    n_queries=st.integers(1, 6),
    inter=st.integers(1, 4),
    intra=st.integers(1, 5),
    samples=st.integers(1, 6),
    depth=st.integers(1, 4),
)
def test_every_sample_completes_within_the_bounds(
    n_queries: int, inter: int, intra: int, samples: int, depth: int
) -> None:
    agents = [f"a{k}" for k in range(depth)]
    flow = chain(*agents)
    cfg = sampling.Config(agents[0], inter, intra, samples)
    waves = sampling.run_to_completion(
        [f"q{i}" for i in range(n_queries)], cfg, next_agent=lambda r: flow[r.agent_id]
    )
    visits = [r for w in waves for r in w]
    assert len(visits) == n_queries * samples * depth
    for wave in waves:
        assert len({r.query_id for r in wave}) <= inter
        per_query: dict[str, int] = {}
        for r in wave:
            per_query[r.query_id] = per_query.get(r.query_id, 0) + 1
        assert max(per_query.values()) <= intra


def test_bad_config() -> None:
    with pytest.raises(SpecError) as err:
        sampling.Config("a", inter_query=0)
    assert err.value.field == "inter_query"
