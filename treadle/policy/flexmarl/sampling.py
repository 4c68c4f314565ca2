"""Dependency-driven parallel sampling across agents (FlexMARL §5.1).

Called by the scheduler service whenever a query, a branch or an agent output changes state, and by
the simulator. It says which rollout requests may start; ``load_balance`` then picks instances.

The baseline (MAS-RL) runs one query at a time through the agents, one sample after another.
FlexMARL dispatches a request as soon as its upstream output exists, with ``inter_query`` queries
in flight (4 in §8.1) and ``intra_query`` samples of one query running at once (16), out of
``samples_per_query`` per query (16: the GRPO group). Every request carries FlexMARL's sample id
``{input_id}_{turn}_{trajectory_id}``, unique within a policy version.

``next_requests`` tops up every admitted query to ``intra_query`` running branches, then admits
pending queries (in the given order) while fewer than ``inter_query`` are in flight; ``on_output``
turns an agent's output into the next agent's request at once (``None`` for a terminal output).
Which agent comes next is the workflow's decision (a router agent's output, a DAG edge), passed
in. Fan-in (an agent waiting on several upstream agents) is not in the paper and not here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from treadle.errors import SpecError


@dataclasses.dataclass(frozen=True)
class Config:
    entry_agent: str
    inter_query: int = 4
    """Queries in flight at once (P_inter)."""
    intra_query: int = 16
    """Samples of one query running at once (P_intra); 1 runs them one after another."""
    samples_per_query: int = 16
    """Trajectories sampled per query (the GRPO group)."""

    def __post_init__(self) -> None:
        for name in ("inter_query", "intra_query", "samples_per_query"):
            if getattr(self, name) < 1:
                raise SpecError("must be at least 1", field=name, value=getattr(self, name))


@dataclasses.dataclass(frozen=True)
class Query:
    """An admitted query: how many of its samples were started and how many reached a terminal."""

    query_id: str
    started: int = 0
    finished: int = 0


@dataclasses.dataclass(frozen=True)
class Request:
    agent_id: str
    query_id: str
    turn: int
    trajectory: int

    @property
    def sample_id(self) -> str:
        """``{input_id}_{number_of_turns}_{trajectory_id}`` (FlexMARL Fig. 3)."""
        return f"{self.query_id}_{self.turn}_{self.trajectory}"


@dataclasses.dataclass(frozen=True)
class Start:
    admit: tuple[str, ...]
    """Pending queries admitted now (in order)."""
    requests: tuple[Request, ...]
    """New samples to start at the entry agent, turn 1."""


def next_requests(queries: Sequence[Query], pending: Sequence[str], cfg: Config) -> Start | None:
    """What to start now; ``None`` when nothing can."""
    requests: list[Request] = []
    in_flight = 0
    for q in queries:
        if q.finished >= cfg.samples_per_query:
            continue  # complete; the shell drops it
        in_flight += 1
        running = q.started - q.finished
        room = min(cfg.intra_query - running, cfg.samples_per_query - q.started)
        requests += [Request(cfg.entry_agent, q.query_id, 1, q.started + k) for k in range(max(0, room))]
    admit = tuple(pending[: max(0, cfg.inter_query - in_flight)])
    for query_id in admit:
        first = min(cfg.intra_query, cfg.samples_per_query)
        requests += [Request(cfg.entry_agent, query_id, 1, k) for k in range(first)]
    if not requests and not admit:
        return None
    return Start(admit=admit, requests=tuple(requests))


def on_output(request: Request, next_agent: str | None) -> Request | None:
    """The downstream request an output enables immediately, or ``None`` when the sample is done."""
    if next_agent is None:
        return None
    return Request(next_agent, request.query_id, request.turn + 1, request.trajectory)


def run_to_completion(
    pending: Sequence[str],
    cfg: Config,
    *,
    next_agent: Callable[[Request], str | None],
    max_waves: int | None = None,
) -> list[tuple[Request, ...]]:
    """Waves of requests when every running request finishes in one time unit (tests, simulator).

    Each wave holds the requests running together: the critical-path length in agent calls is
    ``len(waves)``, which is what parallel sampling shortens.
    """
    queue = list(pending)
    queries: dict[str, Query] = {}
    running: list[Request] = []
    waves: list[tuple[Request, ...]] = []
    cap = max_waves if max_waves is not None else 10_000
    for _ in range(cap):
        start = next_requests(list(queries.values()), queue, cfg)
        if start is not None:
            for query_id in start.admit:
                queue.remove(query_id)
                queries[query_id] = Query(query_id)
            for r in start.requests:
                q = queries[r.query_id]
                queries[r.query_id] = dataclasses.replace(q, started=q.started + 1)
            running += start.requests
        if not running:
            return waves
        waves.append(tuple(running))
        follow: list[Request] = []
        for r in running:
            nxt = on_output(r, next_agent(r))
            if nxt is None:
                q = queries[r.query_id]
                queries[r.query_id] = dataclasses.replace(q, finished=q.finished + 1)
            else:
                follow.append(nxt)
        running = follow
        queries = {k: q for k, q in queries.items() if q.finished < cfg.samples_per_query}
    raise RuntimeError(f"sampling did not finish in {cap} waves")
