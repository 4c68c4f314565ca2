"""The synchronous half of inter-agent rebalancing (FlexMARL §5.2), as a part of ``PlacementService``.

``plan_rebalance`` measures every agent's queue and instances and asks
``treadle.policy.flexmarl.load_balance.rebalance`` for a move (the moved workers are drained at
once); ``finish_move`` re-homes a worker to the receiver's pool. The asynchronous half (waiting for
the drain, the weight swap through the worker's agent) is ``rebalance.Rebalancer``. A mixin over the
service's state, declared below, so the service module stays one concept: assignment.
"""

from __future__ import annotations

import collections
import dataclasses

import prometheus_client as prom

from treadle import errors
from treadle.policy.flexmarl import load_balance
from treadle.services.placement import workers
from treadle.v1 import placement_pb2


class Moves:
    pool_agents: dict[str, str]
    pool_shapes: dict[str, str]
    rebalance_delta: float
    rebalance_rule: load_balance.Rule
    rebalance_step: int
    _workers: dict[str, workers.Worker]
    _targets: dict[str, int]
    _moves: int
    _moved_in: collections.Counter[str]
    _moved_out: collections.Counter[str]
    _rebalanced: prom.Counter
    _agent_queue: prom.Gauge

    def migrate(self, from_worker_id: str) -> int:
        raise NotImplementedError

    def _worker(self, worker_id: str, *, field: str) -> workers.Worker:
        raise NotImplementedError

    def _agent_of(self, w: workers.Worker) -> str:
        return self.pool_agents.get(w.info.pool, "")

    def agent_loads(self) -> list[load_balance.AgentLoad]:
        """Every agent's queue, serving instances and weight version (none without pool agents).

        An agent's queue is the turns assigned to its workers and not running there: per worker the
        larger of the waiting requests it reports and its outstanding turns less those it reports
        running (reports lag assignments). Workers being moved, draining or unhealthy serve no one.
        """
        out = []
        for agent in sorted(set(self.pool_agents.values())):
            serving = sorted((wid, w) for wid, w in self._workers.items() if self._agent_of(w) == agent)
            live = [(wid, w) for wid, w in serving if not w.draining and w.load.healthy]
            queue = sum(max(w.load.waiting, w.outstanding - w.load.running) for _, w in serving)
            first_pool = min(p for p, a in self.pool_agents.items() if a == agent)
            out.append(
                load_balance.AgentLoad(
                    agent_id=agent, queue_len=max(0, queue),
                    instances=tuple(load_balance.Instance(wid, workers.load(w)) for wid, w in live),
                    shape=self.pool_shapes.get(first_pool, ""),
                    weight_version=max((w.load.policy_version for _, w in live), default=0),
                )
            )  # fmt: skip
        return out

    def plan_rebalance(self) -> load_balance.Rebalance | None:
        """One poll of the inter-agent level; the moved workers are drained at once.

        ``None`` while a move is in progress (one at a time, so the queues it changes are measured
        again before the next), with fewer than two agents, when an agent has no serving worker,
        when a chosen worker has no engine address, or when the policy moves nothing.
        """
        if any(w.moving_to for w in self._workers.values()):
            return None
        agents = self.agent_loads()
        for a in agents:
            self._agent_queue.labels(a.agent_id).set(a.queue_len)
        if len(agents) < 2 or any(not a.instances for a in agents):
            return None
        move = load_balance.rebalance(agents, delta=self.rebalance_delta, rule=self.rebalance_rule)
        if move is not None and self.rebalance_step:
            # Turns already queued on a worker stay there, so a move relieves the receiver only as new
            # turns arrive: the rule's k, computed as if queues re-spread at once, overshoots and the
            # next polls move workers back. Smaller steps, each measured again, approach the balance.
            move = dataclasses.replace(move, instance_ids=move.instance_ids[: self.rebalance_step])
        if move is None or any(not self._workers[wid].info.engine_address for wid in move.instance_ids):
            return None
        for wid in move.instance_ids:
            self.migrate(wid)  # no new turn; its sticky trajectories go elsewhere on their next turn
            self._workers[wid].moving_to = move.receiver
        return move

    def outstanding(self, worker_id: str) -> int:
        return self._worker(worker_id, field="worker_id").outstanding

    def worker_info(self, worker_id: str) -> placement_pb2.Worker:
        info = placement_pb2.Worker()
        info.CopyFrom(self._worker(worker_id, field="worker_id").info)
        return info

    def agent_version(self, agent: str) -> int:
        """The version a worker moved to ``agent`` loads: its target (weight sync), else the highest its
        serving workers report."""
        reported = next((a.weight_version for a in self.agent_loads() if a.agent_id == agent), 0)
        return max(reported, self._targets.get(agent, 0))

    def receiver_pool(self, worker_id: str) -> str:
        """The pool a worker being moved joins: the receiver's first pool of the donor's shape."""
        w = self._worker(worker_id, field="worker_id")
        if not w.moving_to:
            raise errors.Conflict(f"worker {worker_id!r} is not being moved")
        donor_shape = self.pool_shapes.get(w.info.pool, "")
        pools = sorted(p for p, a in self.pool_agents.items() if a == w.moving_to)
        same_shape = [p for p in pools if self.pool_shapes.get(p, "") == donor_shape]
        return (same_shape or pools)[0]

    def finish_move(self, worker_id: str, *, loaded: int | None) -> None:
        """End a worker's move: re-homed to the receiver's pool once it ``loaded`` the receiver's
        weights at that version; back to its donor, untouched, when ``None`` (the swap failed)."""
        w = self._worker(worker_id, field="worker_id")
        if not w.moving_to:
            raise errors.Conflict(f"worker {worker_id!r} is not being moved")
        if loaded is not None:
            # Its last report still gives the donor's version: until the next one, what it loaded.
            w.load.policy_version = loaded
            donor = self._agent_of(w)
            w.info.pool = self.receiver_pool(worker_id)
            self._moves += 1
            self._moved_out[donor] += 1
            self._moved_in[w.moving_to] += 1
            self._rebalanced.labels(donor, w.moving_to).inc()
        w.moving_to = ""
        w.draining = False
