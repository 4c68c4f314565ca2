"""Micro-batch driven pipeline: per-agent release and the unified update (FlexMARL §4.3, Fig. 4).

Called by the buffer service whenever an agent's experience table changes (a sample becomes
complete, a micro-batch finishes training) and by the simulator. The buffer claims the released
samples atomically (FlexMARL's ``is_processing`` flag) and hands them to the agent's trainer, which
accumulates gradients without stepping; ``next_update`` says when every agent steps together.

Rules (paper defaults: global batch 64, micro-batch 16, so four releases per agent and step):

* release: once an agent's ready samples (complete, current policy version, unclaimed) *reach* the
  micro-batch size, release one micro-batch (the paper says "exceeds"; we release at equality so
  that 64 = 4 × 16 exactly). The last micro-batch of a step is cut to what the agent's ``target``
  still needs; when the agent's rollout is done, whatever is ready is released as a tail.
* ``loss_scale = samples / target`` makes the accumulated gradient equal the full-batch mean for
  sequence-mean losses (micro-batches may be uneven). An agent that ends short of its target gets
  ``rescale = target / trained`` in the update, so its gradient is still a mean.
* unified update: when every agent has trained its target, or its rollout is done and everything it
  released is trained, all agents step together (policy version + 1). The global barrier is the
  paper's "all agents aggregate"; an agent with no sample this step steps nothing.

What counts as ready is the buffer's contract: only samples of the current policy version (so
staleness is zero), and with GRPO only whole scored groups, since advantages need every reward of
the group (the paper's micro-batch of 16 is then one group).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from treadle.errors import SpecError

DEFAULT_GLOBAL_BATCH = 64
DEFAULT_MICRO_BATCH = 16


@dataclasses.dataclass(frozen=True)
class AgentBatch:
    agent_id: str
    target: int
    """Samples this agent trains on this step (its share of the global batch)."""
    ready: int = 0
    """Complete, unclaimed samples of the current policy version."""
    released: int = 0
    """Samples already released to the trainer this step."""
    trained: int = 0
    """Released samples whose gradients are in the agent's cache."""
    rollout_done: bool = False
    """No more samples will arrive for this agent this step."""


@dataclasses.dataclass(frozen=True)
class Release:
    agent_id: str
    samples: int
    loss_scale: float


@dataclasses.dataclass(frozen=True)
class Update:
    rescale: tuple[tuple[str, float], ...]
    """(agent, factor) for every agent that trained anything; 1.0 unless it ended short."""


def next_release(agent: AgentBatch, *, micro_batch: int = DEFAULT_MICRO_BATCH) -> Release | None:
    """The next micro-batch to hand to ``agent``'s trainer, or ``None``."""
    _check(agent, micro_batch)
    need = agent.target - agent.released
    if need <= 0 or agent.ready <= 0:
        return None
    size = min(micro_batch, need)
    if agent.ready < size:
        if not agent.rollout_done:
            return None
        size = agent.ready  # the tail: nothing more is coming this step
    return Release(agent_id=agent.agent_id, samples=size, loss_scale=size / agent.target)


def next_update(agents: Sequence[AgentBatch]) -> Update | None:
    """The unified weight update, once every agent is through this step; ``None`` before."""
    if not agents:
        return None
    for a in agents:
        if a.trained < a.released:
            return None
        if a.trained < a.target and not (a.rollout_done and a.ready == 0):
            return None
    return Update(rescale=tuple((a.agent_id, a.target / a.trained) for a in agents if a.trained > 0))


@dataclasses.dataclass(frozen=True)
class Arrival:
    """Samples of one agent becoming complete (``done``: the agent's last arrival this step)."""

    agent_id: str
    samples: int
    done: bool = False


def run_to_completion(
    agents: Sequence[AgentBatch],
    arrivals: Sequence[Arrival],
    *,
    micro_batch: int = DEFAULT_MICRO_BATCH,
    max_steps: int | None = None,
) -> tuple[list[Release | Update], tuple[AgentBatch, ...]]:
    """Replay ``arrivals`` with training assumed instant; every decision in order (tests, simulator)."""
    state = {a.agent_id: a for a in agents}
    cap = max_steps if max_steps is not None else sum(a.target for a in agents) + len(arrivals) + 2
    out: list[Release | Update] = []
    steps = 0

    def drain() -> None:
        nonlocal steps
        progress = True
        while progress:
            progress = False
            for agent_id in sorted(state):
                release = next_release(state[agent_id], micro_batch=micro_batch)
                if release is not None:
                    steps += 1
                    if steps > cap:
                        raise RuntimeError(f"pipeline did not settle in {cap} decisions")
                    a = state[agent_id]
                    state[agent_id] = dataclasses.replace(
                        a, ready=a.ready - release.samples, released=a.released + release.samples
                    )
                    state[agent_id] = dataclasses.replace(state[agent_id], trained=state[agent_id].released)
                    out.append(release)
                    progress = True

    for i, arrival in enumerate(arrivals):
        if arrival.agent_id not in state:
            raise SpecError(f"unknown agent {arrival.agent_id!r}", field=f"arrivals[{i}].agent_id")
        a = state[arrival.agent_id]
        state[arrival.agent_id] = dataclasses.replace(
            a, ready=a.ready + arrival.samples, rollout_done=a.rollout_done or arrival.done
        )
        drain()
    update = next_update(list(state.values()))
    if update is not None:
        out.append(update)
    return out, tuple(state[a.agent_id] for a in agents)


def _check(agent: AgentBatch, micro_batch: int) -> None:
    if micro_batch < 1:
        raise SpecError("must be at least 1", field="micro_batch", value=micro_batch)
    for name in ("target", "ready", "released", "trained"):
        if getattr(agent, name) < 0:
            raise SpecError("must be >= 0", field=name, value=getattr(agent, name))
