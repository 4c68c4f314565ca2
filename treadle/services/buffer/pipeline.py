"""The buffer's state of FlexMARL's micro-batch pipeline: one step of every agent's trainer.

Held by ``service.BufferService`` (one per buffer process; the operator runs one replica per job)
and driven by its ``stream_batch`` (releases), ``ack`` (a released micro-batch is trained) and
``await_update`` (the barrier). Every decision is ``treadle.policy.flexmarl.pipeline``'s: this
class only keeps each agent's ``AgentBatch`` up to date and remembers which batch belongs to
which agent. No I/O and no clock, so the unit tests drive it directly.

Durability: ``dump`` / ``load`` turn the whole state into one JSON document that the service hands
to the store with the lease, ack or requeue it goes with (``store.Store``), so a buffer rebuilt on
the same Redis resumes the step where it was: the step number, each agent's released and trained
counts, the released micro-batches not yet acked and the recent updates. The service changes a
copy (``copy``) and keeps it only once the store has taken it, so a refused call changes nothing.

Which agents the barrier waits for: the job's agents when it has several (``agents``), so an
agent whose trainer has not started streaming holds the update back; otherwise whichever agents
stream this step. After the update every agent starts the next step from zero.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

from treadle.errors import Conflict
from treadle.policy.flexmarl import pipeline

KEEP_UPDATES = 8
"""Past updates kept for trainers that ask late (a trainer is at most one step behind the rest)."""


@dataclasses.dataclass(frozen=True)
class Outstanding:
    """A released micro-batch not yet acked."""

    agent: str
    samples: int
    deadline: float
    """Its lease's end (store clock): past it the store redelivers the groups, so it is unreleased."""


class MicroBatchPipeline:
    def __init__(self, agents: Sequence[str] = ()) -> None:
        self.agents = tuple(agents)
        self.step = 0
        self.states: dict[str, pipeline.AgentBatch] = {}
        self.agent_step: dict[str, int] = {}
        self.batches: dict[str, Outstanding] = {}
        self.updates: dict[int, pipeline.Update] = {}

    def begin(self, agent: str, *, target: int) -> pipeline.AgentBatch:
        """The agent's state this step, created with ``target`` at its first stream of the step."""
        state = self.states.get(agent)
        if state is None:
            state = self.states[agent] = pipeline.AgentBatch(agent_id=agent, target=target)
            self.agent_step[agent] = self.step
        elif state.target != target:
            raise Conflict(
                f"agent {agent!r} streams step {self.step} with batch_size {state.target}, not {target}"
            )
        return state

    def next_release(self, agent: str, *, ready: int, micro_batch: int) -> pipeline.Release | None:
        """The agent's next micro-batch by the policy; ``None`` too once its step has closed (a stream
        still open when the last ack closed it, or a second stream of the same trainer)."""
        if agent not in self.states:
            return None
        state = self.states[agent] = dataclasses.replace(self.states[agent], ready=ready)
        return pipeline.next_release(state, micro_batch=micro_batch)

    def released(self, agent: str, *, batch_id: str, samples: int, deadline: float) -> None:
        s = self.states[agent]
        self.states[agent] = dataclasses.replace(
            s, released=s.released + samples, ready=max(0, s.ready - samples)
        )
        self.batches[batch_id] = Outstanding(agent, samples, deadline)

    def rollout_done(self, agent: str) -> None:
        if agent in self.states:  # not once the step has closed
            self.states[agent] = dataclasses.replace(self.states[agent], rollout_done=True)

    def finished(self, agent: str) -> bool:
        """Nothing more will be released to the agent this step (or the step has closed)."""
        s = self.states.get(agent)
        return s is None or s.released >= s.target or (s.rollout_done and s.ready == 0)

    def acked(self, batch_id: str) -> None:
        """A released micro-batch was trained (its ack); other batches are not the pipeline's."""
        batch = self.batches.pop(batch_id, None)
        if batch is not None and batch.agent in self.states:
            s = self.states[batch.agent]
            self.states[batch.agent] = dataclasses.replace(s, trained=s.trained + batch.samples)

    def expire(self, now: float) -> bool:
        """Unrelease the micro-batches whose lease ended by ``now`` (the store redelivers their groups,
        and a trainer that never got them will never ack them); whether any did."""
        gone = [bid for bid, b in self.batches.items() if b.deadline <= now]
        for bid in gone:
            batch = self.batches.pop(bid)
            s = self.states.get(batch.agent)
            if s is not None:
                self.states[batch.agent] = dataclasses.replace(s, released=s.released - batch.samples)
        return bool(gone)

    def try_update(self) -> pipeline.Update | None:
        """The unified update once every agent is through; it closes the step."""
        members = self.agents or tuple(self.states)
        if not members or any(a not in self.states for a in members):
            return None
        update = pipeline.next_update([self.states[a] for a in members])
        if update is None:
            return None
        self.updates[self.step] = update
        self.updates.pop(self.step - KEEP_UPDATES, None)
        self.step += 1
        self.states.clear()
        return update

    def update_for(self, agent: str) -> tuple[int, pipeline.Update | None]:
        """(the agent's step, its update if that step is closed)."""
        step = self.agent_step.get(agent, self.step)
        return step, self.updates.get(step)

    def copy(self) -> MicroBatchPipeline:
        return load(self.dump(), agents=self.agents)

    def dump(self) -> str:
        doc: dict[str, Any] = {
            "step": self.step,
            "states": [dataclasses.asdict(s) for s in self.states.values()],
            "agent_step": self.agent_step,
            "batches": {bid: dataclasses.asdict(b) for bid, b in self.batches.items()},
            "updates": {str(step): u.rescale for step, u in self.updates.items()},
        }
        return json.dumps(doc, separators=(",", ":"))


def load(text: str, *, agents: Sequence[str]) -> MicroBatchPipeline:
    """The state ``MicroBatchPipeline.dump`` wrote; ``agents`` are the job's (its config, not stored)."""
    doc = json.loads(text)
    p = MicroBatchPipeline(agents)
    p.step = int(doc["step"])
    p.states = {s["agent_id"]: pipeline.AgentBatch(**s) for s in doc["states"]}
    p.agent_step = {a: int(step) for a, step in doc["agent_step"].items()}
    p.batches = {bid: Outstanding(**b) for bid, b in doc["batches"].items()}
    p.updates = {
        int(step): pipeline.Update(rescale=tuple((a, float(f)) for a, f in rescale))
        for step, rescale in doc["updates"].items()
    }
    return p
