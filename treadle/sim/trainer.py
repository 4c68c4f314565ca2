"""The trainer's side of a simulated run: form batches, train, publish and commit weight versions.

Functions over the state of a ``treadle.sim.engine.Simulator``, which hands them its trainer events
(``GET_BATCH``, ``TRAIN_DONE``, ``PUSH_DONE``): ``on_get_batch`` evicts stale groups and plans the
batch with ``treadle.policy.batching``; ``start_step`` updates the weights when newer ones are
published and prices training with ``cost.train_time``; ``commit_version`` suspends every worker for
the weight load and aborts what went stale (RollArt §6.2); ``on_train_done`` and ``on_push`` move
the versions on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from treadle.policy import admission, batching
from treadle.sim import cost as cost_mod
from treadle.sim import events, metrics

if TYPE_CHECKING:
    from treadle.sim import engine


def batching_view(sim: engine.Simulator) -> list[batching.Group]:
    out = []
    for g in sim._buffer.values():
        arrived = g.expected if (g.completed >= g.expected or g.terminal >= g.launched) else g.terminal
        out.append(
            batching.Group(
                group_id=str(g.idx),
                task=sim.tasks[g.task].name,
                expected=g.expected,
                seq=g.seq,
                min_version=g.init_version,
                arrived=min(arrived, g.expected),
                completed=min(g.completed, g.expected),
            )
        )
    return out


def evict_stale(sim: engine.Simulator) -> list[events.Event]:
    """RollArt's eager eviction of buffered groups older than ``version - alpha``.

    "version n" (digest §6.2 ambiguity 1) is the paper's "current agent LLM" version: the one the
    workers run (it trails the trainer by the weight push). Evicted trajectories are rejected
    after the fact, which gives their room back to admission.
    """
    view = batching_view(sim)
    for gid in batching.stale_groups(view, version=sim.version, alpha=sim.alpha):
        group = sim._buffer.pop(int(gid))
        group.aborted = True
        sim._ready_completed -= min(group.completed, group.expected)
        sim.evicted += group.completed
        sim.accepted -= group.completed
    return sim._admit_async() if sim.system.mode == "async" else []


def on_get_batch(sim: engine.Simulator, ev: events.Event) -> list[events.Event]:
    if sim.trainer_state != "waiting":
        return []
    out = evict_stale(sim) if sim.system.per_iteration_abort else []
    view = batching_view(sim)
    plan = (
        batching.plan_batch(view, batch_size=sim.batch_size)
        if sim._ready_completed >= sim.batch_size
        else None
    )
    if plan is None:
        return out
    batch: list[int] = []
    for gid in plan:
        group = sim._buffer.pop(int(gid))
        group.consumed = True
        sim._ready_completed -= min(group.completed, group.expected)
        done = [m for m in group.members if sim.trajs[m].state == "done"]
        batch += done[: group.expected]
    return out + start_step(sim, batch)


def start_step(sim: engine.Simulator, batch: list[int]) -> list[events.Event]:
    """The batch is formed: update weights if newer ones are published, then train."""
    sim.trainer_state = "updating"
    batch_at = sim.now
    for idx in batch:
        staleness = sim.version - sim.trajs[idx].init_version
        sim.staleness_sum += staleness
        sim.max_staleness = max(sim.max_staleness, staleness)
    out: list[events.Event] = []
    pause = 0.0
    if sim.system.mode == "async" and sim.published > sim.version:
        pause = sim.pause_s
        out += commit_version(sim, sim.published, pause)
    elif sim.system.mode != "async" and sim.trained_version > sim.version:
        pause = sim.pause_s
        out += commit_version(sim, sim.trained_version, pause)
    sim.used += batch
    tokens = sum(sim.trajs[i].tokens for i in batch)
    train_at = sim.now + pause
    duration = cost_mod.train_time(
        sim.layout.shape0, tokens=tokens, gpus=sim.layout.train_gpus, acc=sim.layout.train_acc
    )
    sim._pending_step = (batch_at, train_at, len(batch), tokens)
    sim.trainer_state = "training"
    out.append(events.Event(train_at + duration, events.Kind.TRAIN_DONE, sim.step + 1))
    if sim.system.mode == "one-off":
        # one-off: rollout k+1 runs under the weights at hand while training consumes batch k
        out.append(events.Event(train_at, events.Kind.ADMIT))
    return out


def commit_version(sim: engine.Simulator, version: int, pause: float) -> list[events.Event]:
    """Suspend, load ``version`` on every worker for ``pause`` seconds, resume (RollArt §6.2)."""
    sim.version = version
    out: list[events.Event] = []
    if sim.system.per_iteration_abort:
        stale = admission.stale_in_flight(
            {str(k): v for k, v in sim.in_flight.items()}, version=sim.version, alpha=sim.alpha
        )
        if stale:
            sim.aborted_stale += len(stale)
            out += sim._abort([int(s) for s in stale])
        out += evict_stale(sim)
    for w in sim.workers:
        out += w.pause(sim.now, pause, recompute=True)
        sim.placer.touch(w)
    if sim.system.mode == "async":
        out += sim._admit_async()
    return out


def on_train_done(sim: engine.Simulator, ev: events.Event) -> list[events.Event]:
    batch_at, train_at, n, tokens = sim._pending_step
    sim.step += 1
    sim.steps.append(
        metrics.StepRecord(
            step=sim.step,
            started_at=sim.step_started,
            batch_at=batch_at,
            train_at=train_at,
            ended_at=sim.now,
            trajectories=n,
            tokens=tokens,
        )
    )
    sim.trained_version = sim.step
    sim.step_started = sim.now
    if sim.step >= sim.cfg.steps:
        sim._done = True
        return []
    sim.trainer_state = "waiting"
    out: list[events.Event] = []
    if sim.system.mode == "async":
        out.append(events.Event(sim.now + sim.push_s, events.Kind.PUSH_DONE, sim.step))
        out += sim._admit_async()  # the trainer's version moved: the staleness window did too
    elif sim.system.mode == "sync":
        # the new weights are broadcast before the next batch starts; the broadcast (workers
        # paused) is part of the next step's wait
        out += commit_version(sim, sim.trained_version, sim.pause_s)
        out.append(events.Event(sim.now, events.Kind.ADMIT))
    # always try: get_batch first evicts stale groups, which may free admission room
    out.append(events.Event(sim.now, events.Kind.GET_BATCH))
    return out


def on_push(sim: engine.Simulator, ev: events.Event) -> list[events.Event]:
    """Weights reached the store. A trainer blocked in get_batch lets the workers update now
    (they pull on demand, RollArt §6.3); otherwise the update waits for the next batch."""
    sim.published = max(sim.published, ev.subject)
    if sim.trainer_state == "waiting" and sim.published > sim.version:
        return commit_version(sim, sim.published, sim.pause_s)
    return []
