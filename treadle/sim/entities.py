"""Simulated entities: trajectories, GRPO groups and inference workers (a continuous-batching engine).

Created and driven by ``treadle.sim.engine``. A ``Worker`` models one vLLM server of ``tp`` GPUs:

* Requests wait until a slot (``max_seqs``) and KV room are free, then are prefilled in one packed
  step (waiting prefills pause decoding, as vLLM's prefill-first scheduler does without chunking).
* Decoding is fluid (DARTS Eq. 4, Heddle §5.1c): every running sequence gains one token per step and
  a step takes ``cost.decode_step(b, C)`` for the current batch b and total context C, so the next
  completion is ``(tokens left of the shortest) * step`` away. A "virtual token clock" makes each
  change O(log b): a sequence finishes when the clock reaches the value it got on joining.
* A weight update pauses the worker (``pause``); surviving sequences re-prefill their whole context
  under the new weights (RollArt §6.2 "recomp"), and stale ones are aborted (``abort``).

Every method returns the events it needs scheduled; ``token`` stamps invalidate superseded ones.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Callable, Sequence

from treadle.sim import cost as cost_mod
from treadle.sim import events


@dataclasses.dataclass(slots=True, eq=False)
class Request:
    """One turn's generation on one worker."""

    traj: int
    new_tokens: int
    """To prefill (the part of the context not served from the prefix cache)."""
    cached_tokens: int
    remaining: float
    """Tokens still to generate."""
    context: int
    """Context when decoding starts (prompt of this turn included)."""
    seq: int
    """Arrival order at this worker."""
    finish_at: float = 0.0
    base: float = 0.0
    dead: bool = False


@dataclasses.dataclass(slots=True)
class Trajectory:
    idx: int
    name: str
    group: int
    task: int
    shape_inputs: tuple[int, ...]
    shape_responses: tuple[int, ...]
    shape_tools: tuple[float, ...]
    reset_s: float
    init_version: int
    started_at: float
    turn: int = 0
    context: int = 0
    worker: int = -1
    """Worker of the previous turn (-1: none yet)."""
    token: int = 0
    """Bumped when the trajectory is aborted, so its pending events are ignored."""
    state: str = "reset"
    """reset, generating, tool, barrier, reward, done, aborted."""
    finished_at: float = 0.0
    request: Request | None = None

    @property
    def turns(self) -> int:
        return len(self.shape_inputs)

    @property
    def tokens(self) -> int:
        return sum(self.shape_inputs) + sum(self.shape_responses)


@dataclasses.dataclass(slots=True)
class Group:
    idx: int
    task: int
    expected: int
    """Members the trainer needs (the GRPO group size)."""
    launched: int
    """Members started (expected plus redundant ones)."""
    init_version: int
    seq: int
    members: list[int] = dataclasses.field(default_factory=list)
    completed: int = 0
    terminal: int = 0
    consumed: bool = False
    aborted: bool = False


class Worker:
    """One inference server (``tp`` GPUs of one accelerator class) under continuous batching."""

    def __init__(
        self,
        *,
        idx: int,
        worker_id: str,
        pool: str,
        engine: cost_mod.EngineCost,
        max_seqs: int,
        kv_capacity: int,
        order: Callable[[Sequence[Request]], list[Request]],
    ) -> None:
        self.idx = idx
        self.order = order
        """Orders ``waiting`` when not all fit: the engine passes ``rollout.schedulingPolicy``."""
        self.worker_id = worker_id
        self.pool = pool
        self.engine = engine
        self.max_seqs = max_seqs
        self.kv_capacity = kv_capacity
        self.waiting: list[Request] = []
        self.pending: list[Request] = []
        self._heap: list[tuple[float, int, Request]] = []
        self.n_running = 0
        self._virtual = 0.0
        self._base_sum = 0.0
        self._pending_ctx = 0
        self.state = "idle"  # idle, prefill, decode, paused
        self._last = 0.0
        self._step = 0.0
        self.token = 0
        self.busy_s = 0.0
        self.prefill_tokens = 0
        self.decode_tokens = 0.0
        self.assigned = 0
        """Turns placement gave this worker (the ``assigned`` counts placement policies read)."""
        self.kv_usage_seen = 0.0
        """KV usage as last reported to placement (the engine refreshes it on every load change)."""
        self._arrivals = 0

    # ----- views used by placement and metrics

    @property
    def load(self) -> int:
        return len(self.waiting) + len(self.pending) + self.n_running

    @property
    def kv_used(self) -> float:
        return self._base_sum + self.n_running * self._virtual + self._pending_ctx

    @property
    def kv_usage(self) -> float:
        return min(1.0, self.kv_used / self.kv_capacity) if self.kv_capacity else 1.0

    # ----- time

    def _advance(self, now: float) -> None:
        dt = now - self._last
        if dt > 0:
            if self.state == "decode" and self.n_running:
                self._virtual += dt / self._step
                self.decode_tokens += self.n_running * dt / self._step
                self.busy_s += dt
            elif self.state == "prefill":
                self.busy_s += dt
        self._last = now

    def _clean_top(self) -> None:
        while self._heap and self._heap[0][2].dead:
            heapq.heappop(self._heap)

    # ----- requests

    def submit(self, req: Request, now: float) -> list[events.Event]:
        self._arrivals += 1
        req.seq = self._arrivals
        self.waiting.append(req)
        return self._kick(now)

    def _admit(self) -> None:
        free = self.max_seqs - self.n_running - len(self.pending)
        if free <= 0 or not self.waiting:
            return
        queue = self.waiting if len(self.waiting) <= free else self.order(self.waiting)
        taken: list[Request] = []
        used = self.kv_used
        for req in queue:
            if len(taken) >= free:
                break
            need = req.context + req.remaining
            if used + need > self.kv_capacity and (self.n_running or self.pending or taken):
                break  # no preemption modelled: wait for room rather than evict
            taken.append(req)
            used += req.context
        if not taken:
            return
        chosen = {id(r) for r in taken}
        self.waiting = [r for r in self.waiting if id(r) not in chosen]
        for req in taken:
            self.pending.append(req)
            self._pending_ctx += req.context

    def _kick(self, now: float) -> list[events.Event]:
        """Start the next engine phase if the worker is not busy with one; return its event."""
        if self.state in ("prefill", "paused"):
            return []
        self._advance(now)
        self._admit()
        self.token += 1
        if self.pending:
            self.state = "prefill"
            flops = 0.0
            new = 0
            kv = 0
            for req in self.pending:
                flops += self.engine.prefill_flops(req.new_tokens, req.cached_tokens)
                new += req.new_tokens
                kv += req.context
            duration = self.engine.prefill_batch(flops=flops, kv_tokens=kv, new_tokens=new)
            self.prefill_tokens += new
            return [events.Event(now + duration, events.Kind.WORKER, self.idx, self.token)]
        if self.n_running:
            self.state = "decode"
            self._step = self.engine.decode_step(self.n_running, self.kv_used)
            self._clean_top()
            left = max(0.0, self._heap[0][0] - self._virtual)
            return [events.Event(now + left * self._step, events.Kind.WORKER, self.idx, self.token)]
        self.state = "idle"
        return []

    def on_event(self, now: float) -> tuple[list[Request], list[events.Event]]:
        """Handle this worker's due event; returns the finished requests and the next event."""
        self._advance(now)
        finished: list[Request] = []
        if self.state == "prefill":
            for req in self.pending:
                if req.dead:  # aborted while its prefill was in flight
                    continue
                req.finish_at = self._virtual + req.remaining
                req.base = req.context - self._virtual
                self._base_sum += req.base
                self.n_running += 1
                heapq.heappush(self._heap, (req.finish_at, req.seq, req))
            self.pending = []
            self._pending_ctx = 0
        elif self.state == "decode":
            epsilon = 1e-6
            while self._heap:
                finish, _, req = self._heap[0]
                if req.dead:
                    heapq.heappop(self._heap)
                    continue
                if finish > self._virtual + epsilon:
                    break
                heapq.heappop(self._heap)
                self._retire(req)
                finished.append(req)
        self.state = "decode" if self.n_running else "idle"
        return finished, self._kick(now)

    def _retire(self, req: Request) -> None:
        self.n_running -= 1
        self._base_sum -= req.base
        req.dead = True
        if not self.n_running:
            self._base_sum = 0.0  # drop float drift once the batch drains

    def abort(self, trajs: set[int], now: float) -> list[events.Event]:
        """Drop every request of ``trajs`` (staleness abort, redundant sibling done)."""
        self._advance(now)
        hit = False
        for _, _, req in list(self._heap):
            if not req.dead and req.traj in trajs:
                self._retire(req)
                hit = True
        kept = [r for r in self.waiting if r.traj not in trajs]
        hit |= len(kept) != len(self.waiting)
        self.waiting = kept
        if self.state != "prefill":
            kept = [r for r in self.pending if r.traj not in trajs]
            hit |= len(kept) != len(self.pending)
            self.pending = kept
            self._pending_ctx = sum(r.context for r in kept)
        else:
            # a prefill in flight finishes as one batch; its aborted members are dropped on landing
            for r in self.pending:
                if r.traj in trajs:
                    r.remaining = 0.0
                    r.dead = True
        if not hit or self.state in ("prefill", "paused"):
            return []
        self.state = "decode" if self.n_running else "idle"
        return self._kick(now)

    def running(self) -> list[Request]:
        """Requests decoding now (a priority round compares them with the waiting ones)."""
        return [req for _, _, req in self._heap if not req.dead]

    def preempt(self, trajs: set[int], now: float) -> tuple[list[Request], list[events.Event]]:
        """Send the running requests of ``trajs`` back to waiting (Heddle §4.2 preemption).

        The preempted sequence keeps its prefix cache (SGLang's radix tree; vLLM's APC after an
        ABORT and re-ADD), so it resumes with nothing to prefill; its KV leaves the running set's
        budget until it is re-admitted (optimistic: no eviction is modelled). Returns the
        replacement requests (now waiting) and the worker's next event.
        """
        self._advance(now)
        out: list[Request] = []
        for _, _, req in list(self._heap):
            if req.dead or req.traj not in trajs:
                continue
            left = max(1.0, req.finish_at - self._virtual)
            context = int(req.base + self._virtual)
            self._retire(req)
            self._arrivals += 1
            fresh = Request(
                traj=req.traj, new_tokens=0, cached_tokens=context, remaining=left, context=context, seq=0
            )
            fresh.seq = self._arrivals
            self.waiting.append(fresh)
            out.append(fresh)
        if not out or self.state in ("prefill", "paused"):
            return out, []
        self.state = "decode" if self.n_running else "idle"
        return out, self._kick(now)

    def pause(self, now: float, duration: float, *, recompute: bool) -> list[events.Event]:
        """Load new weights for ``duration``; with ``recompute`` running sequences re-prefill."""
        self._advance(now)
        if recompute:
            survivors = []
            while self._heap:
                _, _, req = heapq.heappop(self._heap)
                if req.dead:
                    continue
                left = req.finish_at - self._virtual
                req.context = int(req.base + self._virtual)
                req.new_tokens = req.context
                req.cached_tokens = 0
                req.remaining = max(1.0, left)
                req.dead = False
                survivors.append(req)
            self.n_running = 0
            self._base_sum = 0.0
            interrupted = [r for r in self.pending if not r.dead]  # an interrupted prefill starts over
            for req in interrupted:
                req.new_tokens = req.context
                req.cached_tokens = 0
            self.pending = survivors + interrupted
            self._pending_ctx = sum(r.context for r in self.pending)
        self.state = "paused"
        self.token += 1
        return [events.Event(now + duration, events.Kind.WORKER, self.idx, self.token)]

    def resume(self, now: float) -> list[events.Event]:
        """The weight load finished."""
        self._advance(now)
        self.state = "idle"
        return self._kick(now)
