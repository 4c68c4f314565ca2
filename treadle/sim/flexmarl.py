"""FlexMARL reproduction: multi-agent rollout + micro-batch training steps, per variant (Table 3).

Called by the ``flexmarl`` scenario kind (``treadle simulate``, ``bench/sim_flexmarl.py``) and
tests. A step: ``inter_query`` queries in flight, each sampled ``samples_per_query`` times
(``sampling.next_requests`` / ``sampling.on_output``); a sample walks a workflow of agent calls (an
entry agent, then core agents called repeatedly, sometimes an auxiliary one: the paper's >76 % /
<24 % request split). Every agent has its own inference instances, each a continuous-batching
``entities.Worker`` on the roofline cost model (the same engine model as ``treadle.sim.engine``).
The policy code is FlexMARL's, from ``treadle.policy.flexmarl``:

* intra-agent dispatch by ``load_balance.dispatch`` (least outstanding requests) or round-robin;
* inter-agent rebalancing by ``load_balance.rebalance`` every ``poll_s`` (instances move with a
  weight swap that pauses them for ``swap_s``);
* micro-batch release by ``pipeline.next_release`` (a sample is ready when its trajectory is
  rewarded, so its whole chain becomes trainable at once) and the unified update by
  ``pipeline.next_update``; without the pipeline (``asynchronous=False``) nothing is released until
  the whole rollout is done, the DistRL-like barrier.

Training: a shared pool of ``train_gangs`` process groups; each micro-batch takes a free gang for
``cost.train_time`` (our RollArt-calibrated trainer) of its tokens (FIFO when all are busy). The
update plus weight sync costs ``update_s``. Everything it reports is simulated.
"""

from __future__ import annotations

import dataclasses
import math
import random
import time
from collections.abc import Callable, Mapping, Sequence

from treadle import errors
from treadle.policy import costmodel
from treadle.policy.flexmarl import load_balance, pipeline, sampling
from treadle.sim import cost as cost_mod
from treadle.sim import entities, events, workloads


@dataclasses.dataclass(frozen=True)
class Workflow:
    """Agents and how a sample walks them."""

    entry: str
    core: tuple[str, ...]
    """Called repeatedly, in turn, ``core_calls`` times."""
    auxiliary: tuple[str, ...]
    """One of them is called with probability ``auxiliary_p`` before the end."""
    core_calls: workloads.Dist
    auxiliary_p: float
    prompt_tokens: workloads.Dist
    """Context of one agent call (role prompt plus upstream outputs)."""
    response_tokens: workloads.Dist
    """One call's output, capped at 8192 (FlexMARL §8.1)."""
    difficulty_cv: float
    """Spread of a query's difficulty (scales its calls), which makes the 170 s tail (Fig. 1a)."""

    @property
    def agents(self) -> tuple[str, ...]:
        return (self.entry, *self.core, *self.auxiliary)


@dataclasses.dataclass(frozen=True)
class Config:
    workflow: Workflow
    model: costmodel.ModelShape = costmodel.QWEN3_14B
    accelerator: costmodel.Accelerator = costmodel.H800
    instances: Mapping[str, int] = dataclasses.field(default_factory=dict)
    """Inference instances (one GPU each) per agent at the start."""
    max_seqs: int = 64
    queries_per_step: int = 4
    inter_query: int = 4
    intra_query: int = 16
    samples_per_query: int = 16
    micro_batch: int = 16
    train_gangs: int = 4
    train_gpus_per_gang: int = 8
    update_s: float = 3.0
    """Unified optimizer step plus the D2D weight sync to the instances (ours)."""
    swap_s: float = 1.0
    """A moved instance loads the receiver's weights (D2D, flattened buffer; ours)."""
    poll_s: float = 1.0
    delta: float = load_balance.DEFAULT_DELTA
    rule: load_balance.Rule = "literal"
    steps: int = 2
    seed: int = 0


@dataclasses.dataclass(frozen=True)
class Variant:
    name: str
    balancing: bool = True
    """Least-loaded dispatch and inter-agent rebalancing; off: round-robin, static instances."""
    asynchronous: bool = True
    """Micro-batch pipeline; off: train only after the whole rollout (synchronous barrier)."""


VARIANTS: Mapping[str, Variant] = {
    v.name: v
    for v in (
        Variant("flexmarl"),
        Variant("w/o balancing", balancing=False),
        Variant("w/o async", asynchronous=False),
    )
}


@dataclasses.dataclass(frozen=True)
class StepRecord:
    rollout_s: float
    """Start of the step to the last sample's output."""
    e2e_s: float
    """Start of the step to the end of the unified update."""
    tokens: int
    """Generated tokens."""


@dataclasses.dataclass(frozen=True)
class Result:
    variant: str
    label: str
    steps: tuple[StepRecord, ...]
    calls: Mapping[str, int]
    """Agent calls served, per agent (the request split)."""
    migrations: int
    """Instances moved between agents."""
    train_busy_share: float
    wall_s: float

    @property
    def e2e_s(self) -> float:
        return sum(s.e2e_s for s in self.steps) / len(self.steps)

    @property
    def throughput(self) -> float:
        """Generated tokens per second of step time (FlexMARL's tp/s)."""
        return sum(s.tokens for s in self.steps) / sum(s.e2e_s for s in self.steps)


@dataclasses.dataclass(slots=True)
class _Sample:
    request: sampling.Request
    calls: tuple[str, ...]
    prompts: tuple[int, ...]
    outputs: tuple[int, ...]
    done_calls: int = 0
    current: entities.Request | None = None
    """The live request (a finished request that is not this one was aborted and re-dispatched)."""


class Sim:
    def __init__(self, cfg: Config, variant: Variant) -> None:
        wf = cfg.workflow
        if set(cfg.instances) != set(wf.agents) or min(cfg.instances.values()) < 1:
            raise errors.SpecError("every agent needs at least one instance", field="instances")
        self.cfg, self.variant = cfg, variant
        self.rng = random.Random(cfg.seed)
        self.queue = events.Queue()
        self.now = 0.0
        engine = cost_mod.Roofline(cfg.accelerator, cfg.model, 1)
        kv = costmodel.kv_capacity_tokens(cfg.accelerator, cfg.model, tp=1)
        self.workers: list[entities.Worker] = []
        self.home: dict[int, str] = {}
        for agent in wf.agents:
            for _ in range(cfg.instances[agent]):
                i = len(self.workers)
                w = entities.Worker(
                    idx=i,
                    worker_id=f"i{i:02d}",
                    pool=agent,
                    engine=engine,
                    max_seqs=cfg.max_seqs,
                    kv_capacity=kv,
                    order=_fifo,
                )
                self.workers.append(w)
                self.home[i] = agent
        self.swapping: dict[int, str] = {}
        """Instances loading a receiver's weights -> the receiver."""
        self.rr: dict[str, int] = {a: 0 for a in wf.agents}
        self.backlog: dict[str, list[int]] = {a: [] for a in wf.agents}
        """Requests (sample index) of an agent with no instance free to take them (while all swap)."""
        self.calls = {a: 0 for a in wf.agents}
        self.migrations = 0
        self.moves: list[load_balance.Rebalance] = []
        self.train_busy = 0.0
        self.records: list[StepRecord] = []

    # ------------------------------------------------------------------ workload

    def _sample(self, request: sampling.Request, difficulty: float) -> _Sample:
        wf = self.cfg.workflow
        n_core = max(1, round(wf.core_calls.sample(self.rng) * difficulty))
        if math.isfinite(wf.core_calls.high):
            n_core = min(n_core, round(wf.core_calls.high))  # the cap holds after the query's difficulty
        calls = [wf.entry] + [wf.core[k % len(wf.core)] for k in range(n_core)]
        if wf.auxiliary and self.rng.random() < wf.auxiliary_p:
            calls.append(self.rng.choice(wf.auxiliary))
        prompts = tuple(max(1, round(wf.prompt_tokens.sample(self.rng))) for _ in calls)
        outputs = tuple(
            max(1, min(8192, round(wf.response_tokens.sample(self.rng) * math.sqrt(difficulty))))
            for _ in calls
        )
        return _Sample(request, tuple(calls), prompts, outputs)

    # ------------------------------------------------------------------ dispatch

    def _instances(self, agent: str) -> list[entities.Worker]:
        return [w for w in self.workers if self.home[w.idx] == agent and w.idx not in self.swapping]

    def _dispatch(self, agent: str, sample_idx: int) -> list[events.Event]:
        ws = self._instances(agent)
        if not ws:
            self.backlog[agent].append(sample_idx)
            return []
        if self.variant.balancing:
            loads = [load_balance.Instance(w.worker_id, w.load) for w in ws]
            ((_, chosen),) = load_balance.dispatch([str(sample_idx)], loads)
            w = next(x for x in ws if x.worker_id == chosen)
        else:
            w = ws[self.rr[agent] % len(ws)]
            self.rr[agent] += 1
        s = self.samples[sample_idx]
        k = s.done_calls
        req = entities.Request(
            traj=sample_idx,
            new_tokens=s.prompts[k],
            cached_tokens=0,
            remaining=float(s.outputs[k]),
            context=s.prompts[k],
            seq=0,
        )
        self.calls[agent] += 1
        s.current = req
        return w.submit(req, self.now)

    # ------------------------------------------------------------------ step

    def _start_step(self) -> list[events.Event]:
        cfg = self.cfg
        self.step_start = self.now
        self.samples: list[_Sample] = []
        self.by_id: dict[str, int] = {}
        self.queries: dict[str, sampling.Query] = {}
        self.pending = [f"s{len(self.records)}q{q}" for q in range(cfg.queries_per_step)]
        self.difficulty = {
            q: workloads.Dist("lognormal", 1.0, cv=cfg.workflow.difficulty_cv).sample(self.rng)
            for q in self.pending
        }
        self.scfg = sampling.Config(
            cfg.workflow.entry,
            inter_query=cfg.inter_query,
            intra_query=cfg.intra_query,
            samples_per_query=cfg.samples_per_query,
        )
        self.agent_batch = {a: pipeline.AgentBatch(a, target=0) for a in cfg.workflow.agents}
        self.train_queue: list[tuple[str, int, int]] = []
        self.gangs_free = cfg.train_gangs
        self.tokens = 0
        self.rollout_end = -1.0
        self.updating = False
        return self._admit()

    def _admit(self) -> list[events.Event]:
        start = sampling.next_requests(list(self.queries.values()), self.pending, self.scfg)
        if start is None:
            return []
        for qid in start.admit:
            self.pending.remove(qid)
            self.queries[qid] = sampling.Query(qid)
        out: list[events.Event] = []
        for r in start.requests:
            q = self.queries[r.query_id]
            self.queries[r.query_id] = dataclasses.replace(q, started=q.started + 1)
            s = self._sample(r, self.difficulty[r.query_id])
            idx = len(self.samples)
            self.samples.append(s)
            for agent in s.calls:  # an agent's step target: the calls it will serve (known to the sim)
                a = self.agent_batch[agent]
                self.agent_batch[agent] = dataclasses.replace(a, target=a.target + 1)
            out += self._dispatch(r.agent_id, idx)
        return out

    def _on_worker(self, ev: events.Event) -> list[events.Event]:
        w = self.workers[ev.subject]
        if ev.token != w.token:
            return []
        if w.state == "paused":  # a weight swap finished: the instance joins its receiver
            self.home[w.idx] = self.swapping.pop(w.idx)
            out = w.resume(self.now)
            agent = self.home[w.idx]
            backlog, self.backlog[agent] = self.backlog[agent], []
            for idx in backlog:
                out += self._dispatch(agent, idx)
            return out
        finished, out = w.on_event(self.now)
        for req in finished:
            if req.traj < len(self.samples) and self.samples[req.traj].current is req:
                out += self._call_done(req.traj)
        return out

    def _call_done(self, idx: int) -> list[events.Event]:
        s = self.samples[idx]
        self.tokens += s.outputs[s.done_calls]
        s.done_calls += 1
        nxt = s.calls[s.done_calls] if s.done_calls < len(s.calls) else None
        follow = sampling.on_output(s.request, nxt)
        if follow is not None:
            s.request = follow
            return self._dispatch(follow.agent_id, idx)
        # terminal: rewarded, every call of the sample becomes trainable (rule reward, instant)
        q = self.queries[s.request.query_id]
        self.queries[s.request.query_id] = dataclasses.replace(q, finished=q.finished + 1)
        for agent in s.calls:
            a = self.agent_batch[agent]
            self.agent_batch[agent] = dataclasses.replace(a, ready=a.ready + 1)
        out = self._admit()
        self.queries = {k: v for k, v in self.queries.items() if v.finished < self.cfg.samples_per_query}
        if not self.queries and not self.pending:
            self.rollout_end = self.now
            for agent, a in self.agent_batch.items():
                self.agent_batch[agent] = dataclasses.replace(a, rollout_done=True)
        return out + self._train()

    # ------------------------------------------------------------------ training

    def _train(self) -> list[events.Event]:
        if not self.variant.asynchronous and self.rollout_end < 0:
            return []  # the barrier: nothing trains before the whole rollout is done
        for agent in sorted(self.agent_batch):
            while release := pipeline.next_release(self.agent_batch[agent], micro_batch=self.cfg.micro_batch):
                a = self.agent_batch[agent]
                self.agent_batch[agent] = dataclasses.replace(
                    a, ready=a.ready - release.samples, released=a.released + release.samples
                )
                tokens = release.samples * self._tokens_per_sample()
                self.train_queue.append((agent, release.samples, tokens))
        out: list[events.Event] = []
        while self.train_queue and self.gangs_free > 0:
            agent, samples, tokens = self.train_queue.pop(0)
            self.gangs_free -= 1
            duration = cost_mod.train_time(
                self.cfg.model, tokens=tokens, gpus=self.cfg.train_gpus_per_gang, acc=self.cfg.accelerator
            )
            self.train_busy += duration
            self._trains.append((agent, samples))
            out.append(events.Event(self.now + duration, events.Kind.TRAIN_DONE, len(self._trains) - 1))
        return out + self._maybe_update()

    def _tokens_per_sample(self) -> int:
        """Training tokens of one released sample: the workflow's mean call. The pipeline releases
        counts, not identities (the buffer picks which rows), so a micro-batch is priced at the mean."""
        wf = self.cfg.workflow
        return round(wf.prompt_tokens.mean + wf.response_tokens.mean)

    def _on_train_done(self, ev: events.Event) -> list[events.Event]:
        agent, samples = self._trains[ev.subject]
        a = self.agent_batch[agent]
        self.agent_batch[agent] = dataclasses.replace(a, trained=a.trained + samples)
        self.gangs_free += 1
        return self._train()

    def _maybe_update(self) -> list[events.Event]:
        if (
            self.updating
            or self.rollout_end < 0
            or pipeline.next_update(list(self.agent_batch.values())) is None
        ):
            return []
        self.updating = True
        return [events.Event(self.now + self.cfg.update_s, events.Kind.PUSH_DONE)]

    def _on_update(self, ev: events.Event) -> list[events.Event]:
        self.records.append(
            StepRecord(self.rollout_end - self.step_start, self.now - self.step_start, self.tokens)
        )
        if len(self.records) >= self.cfg.steps:
            return []
        return self._start_step()

    # ------------------------------------------------------------------ rebalancing

    def _on_poll(self, ev: events.Event) -> list[events.Event]:
        out: list[events.Event] = []
        if len(self.records) >= self.cfg.steps:
            return out
        if self.variant.balancing:
            agents = [
                load_balance.AgentLoad(
                    agent,
                    queue_len=sum(len(w.waiting) for w in self._instances(agent)) + len(self.backlog[agent]),
                    instances=tuple(
                        load_balance.Instance(w.worker_id, w.load) for w in self._instances(agent)
                    ),
                )
                for agent in self.cfg.workflow.agents
                if self._instances(agent)
            ]
            move = (
                load_balance.rebalance(agents, delta=self.cfg.delta, rule=self.cfg.rule)
                if len(agents) > 1
                else None
            )
            if move is not None:
                out += self._move(move)
        out.append(events.Event(self.now + self.cfg.poll_s, events.Kind.POLL))
        return out

    def _move(self, move: load_balance.Rebalance) -> list[events.Event]:
        out: list[events.Event] = []
        self.moves.append(move)
        ids = set(move.instance_ids)
        for w in self.workers:
            if w.worker_id not in ids:
                continue
            victims = {r.traj for r in (*w.running(), *w.waiting, *w.pending)}
            self.swapping[w.idx] = move.receiver
            self.migrations += 1
            out += w.abort(victims, self.now)
            out += w.pause(self.now, self.cfg.swap_s, recompute=False)
            for idx in sorted(victims):  # back to the donor's queue: re-dispatched to its other instances
                self.calls[move.donor] -= 1
                out += self._dispatch(move.donor, idx)
        return out

    # ------------------------------------------------------------------ run

    def run(self) -> Result:
        started = time.perf_counter()
        self._trains: list[tuple[str, int]] = []
        self.queue.push_all(self._start_step())
        self.queue.push(events.Event(self.cfg.poll_s, events.Kind.POLL))
        handlers: dict[events.Kind, Callable[[events.Event], list[events.Event]]] = {
            events.Kind.WORKER: self._on_worker,
            events.Kind.TRAIN_DONE: self._on_train_done,
            events.Kind.PUSH_DONE: self._on_update,
            events.Kind.POLL: self._on_poll,
        }
        count = 0
        while self.queue and len(self.records) < self.cfg.steps:
            ev = self.queue.pop()
            self.now = ev.time
            self.queue.push_all(handlers[ev.kind](ev))
            count += 1
            if count > 5_000_000:
                raise errors.Unavailable("flexmarl simulation exceeded 5M events")
        if len(self.records) < self.cfg.steps:
            raise errors.Unavailable(f"stalled after {len(self.records)} of {self.cfg.steps} steps")
        total = self.now
        return Result(
            variant=self.variant.name,
            label="simulated",
            steps=tuple(self.records),
            calls=dict(self.calls),
            migrations=self.migrations,
            train_busy_share=self.train_busy / (self.cfg.train_gangs * total) if total > 0 else 0.0,
            wall_s=time.perf_counter() - started,
        )


def run(cfg: Config, variants: Sequence[Variant]) -> list[Result]:
    """Every variant on the same seed (the same queries and samples)."""
    return [Sim(cfg, v).run() for v in variants]


def _fifo(waiting: Sequence[entities.Request]) -> list[entities.Request]:
    """Instances serve their queue in arrival order (vLLM's default)."""
    return sorted(waiting, key=lambda r: r.seq)


def parse_workflow(raw: Mapping[str, object], *, field: str) -> Workflow:
    """A ``Workflow`` from a scenario mapping; ``SpecError`` names the field."""
    dists = {}
    for key in ("core_calls", "prompt_tokens", "response_tokens"):
        if key not in raw:
            raise errors.SpecError("is required", field=f"{field}.{key}")
        dists[key] = workloads.parse_dist(raw[key], field=f"{field}.{key}")
    try:
        core = tuple(str(a) for a in raw["core"])  # type: ignore[attr-defined]
        auxiliary = tuple(str(a) for a in raw.get("auxiliary", ()))  # type: ignore[attr-defined]
        workflow = Workflow(
            entry=str(raw["entry"]),
            core=core,
            auxiliary=auxiliary,
            auxiliary_p=float(raw.get("auxiliary_p", 0.0)),  # type: ignore[arg-type]
            difficulty_cv=float(raw.get("difficulty_cv", 0.0)),  # type: ignore[arg-type]
            **dists,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise errors.SpecError(f"bad workflow: {exc}", field=field) from None
    if not core or len(set(workflow.agents)) != len(workflow.agents):
        raise errors.SpecError("needs core agents and distinct agent names", field=field)
    return workflow
