"""Hierarchical load balancing of multi-agent rollout (FlexMARL §5.2, Fig. 5).

Called by the simulator (every level), and live by the placement service: every poll of
``treadle.services.placement.rebalance.Rebalancer`` runs ``rebalance`` on the agents' measured
queues (``PlacementService.plan_rebalance``). Live, a turn goes to a worker by placement's own
sticky least-loaded policy within its agent's pools, not by ``dispatch``, and a lost turn is the
scheduler's retry, not ``expire``.

Level 1, intra-agent. Each agent's rollout manager keeps a min-heap of its instances' loads and
sends a request to the least-loaded one. The load is the number of outstanding requests (ours; the
paper leaves it open); ties go to the instance id. A request past its deadline is cancelled, its
instance's load released, and it is re-queued, up to ``max_attempts`` dispatches in all (ours),
after which it fails; each expired request is reported exactly once per call.

Level 2, inter-agent. Poll every agent's request-queue length ``q``. With ``hi`` the most loaded
agent and ``lo`` the least loaded agent that can give (at least two instances, and the same
instance shape as ``hi``: model and TP must match, which the paper does not discuss), when the
disparity ``d`` exceeds ``delta`` (5 in §8.1), ``k`` instances move from ``lo`` to ``hi``:

* ``rule="literal"``, the paper: ``d = q_hi - q_lo`` and ``k = min(d, n_lo - 1)`` (requests
  converted one for one into instances, capped by the one-instance floor);
* ``rule="per-instance"``, ours: ``d`` compares queued requests per instance, ``q / n``, and ``k``
  in ``1..n_lo - 1`` minimises the larger of the two agents' pressures after the move (smallest
  ``k`` on ties); a move that would not lower it is not made, so repeated polls settle.

The least-loaded instances of ``lo`` move; their outstanding requests return to ``lo``'s queue.
Each moved instance must load ``hi``'s current weights (``Rebalance.weight_version``, fetched by
key through the weight store) before it registers with ``hi``'s heap: the weight swap.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Sequence
from typing import Literal

from treadle.errors import SpecError

DEFAULT_DELTA = 5
"""FlexMARL §8.1: the queue-length disparity that triggers a rebalance."""

Rule = Literal["literal", "per-instance"]


@dataclasses.dataclass(frozen=True)
class Instance:
    instance_id: str
    load: int
    """Outstanding requests on this inference instance."""


def dispatch(requests: Sequence[str], instances: Sequence[Instance]) -> list[tuple[str, str]]:
    """(request, instance) for each request in order, each to the least-loaded instance (min-heap)."""
    if not instances:
        raise SpecError("an agent needs at least one instance", field="instances", value=[])
    heap = [(i.load, i.instance_id) for i in instances]
    heapq.heapify(heap)
    out: list[tuple[str, str]] = []
    for request in requests:
        load, instance_id = heap[0]
        heapq.heapreplace(heap, (load + 1, instance_id))
        out.append((request, instance_id))
    return out


@dataclasses.dataclass(frozen=True)
class InFlight:
    request_id: str
    instance_id: str
    deadline: float
    """Time by the shell's clock after which the request counts as lost."""
    attempts: int = 1
    """Dispatches so far, this one included."""


@dataclasses.dataclass(frozen=True)
class Expired:
    requeue: tuple[str, ...]
    fail: tuple[str, ...]
    released: tuple[tuple[str, int], ...]
    """(instance, load to subtract), by instance id."""


def expire(in_flight: Sequence[InFlight], *, now: float, max_attempts: int = 3) -> Expired | None:
    """What to do with requests whose deadline has passed at ``now``; ``None`` if none has."""
    if max_attempts < 1:
        raise SpecError("must be at least 1", field="max_attempts", value=max_attempts)
    late = sorted((r for r in in_flight if r.deadline <= now), key=lambda r: (r.deadline, r.request_id))
    if not late:
        return None
    released: dict[str, int] = {}
    for r in late:
        released[r.instance_id] = released.get(r.instance_id, 0) + 1
    return Expired(
        requeue=tuple(r.request_id for r in late if r.attempts < max_attempts),
        fail=tuple(r.request_id for r in late if r.attempts >= max_attempts),
        released=tuple(sorted(released.items())),
    )


@dataclasses.dataclass(frozen=True)
class AgentLoad:
    agent_id: str
    queue_len: int
    """Requests waiting for one of this agent's instances."""
    instances: tuple[Instance, ...]
    shape: str = ""
    """Instance shape (model and TP); instances only move between agents of one shape."""
    weight_version: int = 0


@dataclasses.dataclass(frozen=True)
class Rebalance:
    donor: str
    receiver: str
    instance_ids: tuple[str, ...]
    weight_version: int
    """The receiver's weights the moved instances load before serving it."""


def rebalance(
    agents: Sequence[AgentLoad], *, delta: float = DEFAULT_DELTA, rule: Rule = "literal"
) -> Rebalance | None:
    """One poll of the inter-agent level; ``None`` when nothing should move."""
    _check(agents, delta)

    def pressure(a: AgentLoad) -> float:
        return _pressure(rule, a.queue_len, len(a.instances))

    hi = min(agents, key=lambda a: (-pressure(a), a.agent_id))
    donors = [a for a in agents if a is not hi and a.shape == hi.shape and len(a.instances) >= 2]
    if not donors:
        return None
    lo = min(donors, key=lambda a: (pressure(a), a.agent_id))
    n_hi, n_lo = len(hi.instances), len(lo.instances)
    if pressure(hi) - pressure(lo) <= delta:
        return None
    if rule == "literal":
        k = min(hi.queue_len - lo.queue_len, n_lo - 1)
    else:
        before = max(hi.queue_len / n_hi, lo.queue_len / n_lo)
        k = min(range(1, n_lo), key=lambda k: (max(hi.queue_len / (n_hi + k), lo.queue_len / (n_lo - k)), k))
        if max(hi.queue_len / (n_hi + k), lo.queue_len / (n_lo - k)) >= before:
            return None
    moved = sorted(lo.instances, key=lambda i: (i.load, i.instance_id))[:k]
    return Rebalance(
        donor=lo.agent_id,
        receiver=hi.agent_id,
        instance_ids=tuple(i.instance_id for i in moved),
        weight_version=hi.weight_version,
    )


def apply(agents: Sequence[AgentLoad], move: Rebalance) -> tuple[AgentLoad, ...]:
    """The agents after ``move``: instances re-homed idle, their requests back in the donor's queue."""
    out: list[AgentLoad] = []
    ids = set(move.instance_ids)
    donor = next(a for a in agents if a.agent_id == move.donor)
    moved = [i for i in donor.instances if i.instance_id in ids]
    requeued = sum(i.load for i in moved)
    for a in agents:
        if a.agent_id == move.donor:
            kept = tuple(i for i in a.instances if i.instance_id not in ids)
            a = dataclasses.replace(a, instances=kept, queue_len=a.queue_len + requeued)
        elif a.agent_id == move.receiver:
            fresh = tuple(Instance(i.instance_id, 0) for i in moved)
            a = dataclasses.replace(a, instances=a.instances + fresh)
        out.append(a)
    return tuple(out)


def run_to_completion(
    agents: Sequence[AgentLoad],
    *,
    delta: float = DEFAULT_DELTA,
    rule: Rule = "literal",
    max_steps: int | None = None,
) -> tuple[list[Rebalance], tuple[AgentLoad, ...]]:
    """Polls on frozen queues until nothing moves (tables in tests; the simulator interleaves arrivals)."""
    state = tuple(agents)
    cap = max_steps if max_steps is not None else sum(len(a.instances) for a in agents) + 1
    moves: list[Rebalance] = []
    for _ in range(cap):
        move = rebalance(state, delta=delta, rule=rule)
        if move is None:
            return moves, state
        moves.append(move)
        state = apply(state, move)
    raise RuntimeError(f"rebalancing did not settle in {cap} polls")


def _pressure(rule: Rule, queue_len: int, instances: int) -> float:
    return float(queue_len) if rule == "literal" else queue_len / instances


def _check(agents: Sequence[AgentLoad], delta: float) -> None:
    if delta < 0:
        raise SpecError("must be >= 0", field="delta", value=delta)
    seen: set[str] = set()
    for i, a in enumerate(agents):
        if a.agent_id in seen:
            raise SpecError(
                f"duplicate agent {a.agent_id!r}", field=f"agents[{i}].agent_id", value=a.agent_id
            )
        seen.add(a.agent_id)
        if not a.instances:
            raise SpecError(
                "every agent keeps at least one instance", field=f"agents[{i}].instances", value=[]
            )
        if a.queue_len < 0:
            raise SpecError("must be >= 0", field=f"agents[{i}].queue_len", value=a.queue_len)
    if not agents:
        raise SpecError("no agents", field="agents", value=[])
