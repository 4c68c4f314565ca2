"""DARTS in the simulator: synchronous GRPO steps over a learning length policy (SIMULATED).

Called by the ``darts`` scenario kind (``treadle.sim.kinds.darts``) and ``bench/sim_darts.py``. Every
DARTS decision is the pure policy's, unchanged: ``stats.update``/``sigmas``/``dispersion``,
``budget.fit_ptl``/``marginal_cost``/``total_budget``/``rollout_time_dp``, ``allocate`` and
``selection.select``/``group_advantages``. What is ours is the world around it, stated here.

**Engine cost** (digest §6.1 item 4). The per-token latency is *fitted* (``budget.fit_ptl``) to
decode-step times the roofline model (``treadle.policy.costmodel.decode_step_time``, the model's TP
on the accelerator, at ``context`` tokens per sequence) gives at batch sizes 1-512: simulated
measurements standing in for a profile of the real engine. A step's rollout is Eq. 4 on each
replica (every candidate of a step starts together, each interval decodes at the live batch), the
slowest replica ending it; a prompt's candidates share a replica (least candidates first), so
early stop is a local decision. Prefill is left out (short math prompts; every system pays it).
Early stop aborts the surplus of a saturated prompt when its ``M``-th valid candidate finishes:
their lengths become that candidate's length (Eq. 4 frees their slots there).

**Training** (disaggregated, as the paper's stack): ``gpus · rollout_share`` GPUs roll out, the rest
train. Training costs ``8·P`` FLOPs per selected token (``6·P`` forward+backward of the actor,
``2·P`` for the old-policy log-prob forward; DAPO drops the KL term, so no reference forward) at
``train_mfu``; a weight sync of
``sync_s`` follows. Token-level streaming (Table 3's first step) runs the log-prob forward on
chunks during the rollout, so only the forwards of the chunks that end in the rollout's last
``chunk`` tokens stay exposed; forwards of candidates selection later drops cost trainer time that
was idle anyway (the trainer waits for the rollout), so they are not charged.

**Policy response** (digest §6.1 item 3; the crux, and an ASSUMPTION): prompt ``q`` answers with
lengths ``exp(mu_q + s_q·z)``, ``z ~ N(0, 1)``, truncated at ``max_tokens`` (``finish_reason=length``,
reward -1: DAPO's overlong penalty). It is correct with probability ``sigmoid(a_q - slope·z)``
for Pattern I prompts (share ``pattern_i``: right when short) and ``sigmoid(a_q + slope·min(z, 0))``
for Pattern II (wrong when shallower than the prompt's typical depth, no gain from going beyond it:
the depth is necessary, not the verbosity). Each step, every trained prompt takes one GRPO
score-function step on its length policy with the advantages of its *selected* group:
``mu += lr_mu·s·mean(A·z)``, ``log s += lr_sigma·mean(A·(z² - 1))``. Standard groups give the
unbiased gradient; dual-end groups bias it as Props. 1-2 say (the short-anchored baseline
suppresses verbose Pattern I tails, boosts valid Pattern II depth); shortest-only groups push
hardest toward short. The learning rates and ``lambda`` are the calibrated knobs (see
``bench/reports/darts.md``); the size of the learned shift is the part no simulator can establish
(digest §6.2).

**Systems**: ``verl`` (synchronous, ``M`` per prompt, no streaming), ``tail-batching`` (RollPacker:
``N·(1 + oversample)`` prompts, the first ``N`` groups to finish train, the rest are aborted and
deferred to a queue that runs as a full step of its own once it holds ``N``), ``streaming`` (verl +
token streaming), ``uniform`` (+ DARTS sampling with the same pool for every prompt),
``darts`` (+ adaptive allocation), and ``darts-L:K`` for the Table 4 ratios.
"""

from __future__ import annotations

import dataclasses
import math
import random
import statistics
from collections.abc import Mapping, Sequence

from treadle import errors
from treadle.policy import costmodel
from treadle.policy.darts import budget, plan, selection, stats

PTL_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 192, 256, 384, 512)
"""Batch sizes the simulated PTL profile measures (the paper's sweep shape, App. A)."""


@dataclasses.dataclass(frozen=True)
class System:
    """One compared system: which of DARTS's mechanisms it uses."""

    name: str
    streaming: bool = False
    darts: bool = False
    adaptive: bool = False
    """Alg. 1 weights from per-prompt variance; otherwise every prompt weighs the same (uniform)."""
    long_end: int | None = None
    """L of the dual-end split (``None``: the scenario's)."""
    oversample: bool = False
    """Tail Batching."""


SYSTEMS: Mapping[str, System] = {
    s.name: s
    for s in (
        System("verl"),
        System("tail-batching", oversample=True),
        System("streaming", streaming=True),
        System("uniform", streaming=True, darts=True),
        System("darts", streaming=True, darts=True, adaptive=True),
        System("darts-2:6", streaming=True, darts=True, adaptive=True, long_end=2),
        System("darts-4:4", streaming=True, darts=True, adaptive=True, long_end=4),
    )
}


@dataclasses.dataclass(frozen=True)
class Workload:
    """The prompts' length policies and reward model at step 0 (all ours; digest §1.3 shapes)."""

    median_tokens: float
    inter_sigma: float
    """Spread of prompts' log-median lengths (inter-prompt tail: max 5-10x the median)."""
    intra_sigma: float
    """Mean per-prompt log-length std (intra-prompt tail); each prompt's is drawn around it."""
    pattern_i: float
    """Share of Pattern I prompts."""
    difficulty: float
    """Std of the prompts' logit offsets ``a_q``."""
    slope: float
    """How strongly correctness follows length (logit per std of log-length)."""
    prompt_tokens: int


@dataclasses.dataclass(frozen=True)
class Config:
    model: costmodel.ModelShape
    accelerator: costmodel.Accelerator
    gpus: int
    tp: int
    rollout_share: float
    prompts: int
    """Prompts in the dataset (a batch is ``batch`` of them; epochs go round)."""
    batch: int
    group: int
    m_up: int
    long_end: int
    lam: float
    ema_decay: float
    max_tokens: int
    context: int
    """Tokens per sequence the PTL profile is measured at."""
    chunk: int
    train_mfu: float
    sync_s: float
    oversample: float
    lr_mu: float
    lr_sigma: float
    workload: Workload
    steps: int
    seed: int

    def __post_init__(self) -> None:
        if not 0 < self.long_end < self.group:
            raise errors.SpecError(
                f"must be in [1, group = {self.group})", field="long_end", value=self.long_end
            )
        if self.m_up < self.group:
            raise errors.SpecError(f"must be >= group = {self.group}", field="m_up", value=self.m_up)
        if self.replicas < 1 or self.train_gpus < 1:
            raise errors.SpecError("leaves no rollout replica or training GPU", field="gpus", value=self.gpus)

    @property
    def replicas(self) -> int:
        return int(self.gpus * self.rollout_share) // self.tp

    @property
    def train_gpus(self) -> int:
        return self.gpus - self.replicas * self.tp


@dataclasses.dataclass(frozen=True)
class Step:
    rollout_s: float
    train_s: float
    step_s: float
    candidates: int
    aborted: int
    saturated: int
    budget: int
    mean_length: float
    """Mean length of the trained (selected) responses."""
    accuracy: float


@dataclasses.dataclass(frozen=True)
class Result:
    system: str
    steps: tuple[Step, ...]
    trained_samples: int

    @property
    def time_s(self) -> float:
        return sum(s.step_s for s in self.steps)

    @property
    def throughput(self) -> float:
        """Trained samples per second over the whole run."""
        return self.trained_samples / self.time_s if self.time_s > 0 else 0.0


@dataclasses.dataclass
class _Prompt:
    mu: float
    sigma: float
    sign: float
    a: float


def fit_profile(cfg: Config) -> budget.Ptl:
    """PTL fitted to simulated per-token latencies of the model's TP replica (roofline model)."""
    samples = [
        (
            float(b),
            costmodel.decode_step_time(
                cfg.accelerator, cfg.model, batch=b, context_tokens=b * cfg.context, tp=cfg.tp
            ),
        )
        for b in PTL_BATCHES
    ]
    return budget.fit_ptl(samples)


class _Run:
    def __init__(self, cfg: Config, system: System) -> None:
        self.cfg, self.system = cfg, system
        world = random.Random(cfg.seed)  # the dataset: the same for every system of a seed
        w = cfg.workload
        self.prompts = [
            _Prompt(
                mu=math.log(w.median_tokens) + world.gauss(0.0, w.inter_sigma),
                sigma=w.intra_sigma * math.exp(world.gauss(0.0, 0.25)),
                sign=-1.0 if world.random() < w.pattern_i else 1.0,
                a=world.gauss(0.0, w.difficulty),
            )
            for _ in range(cfg.prompts)
        ]
        self.rng = random.Random(f"{cfg.seed}/{system.name}")
        self.ptl = fit_profile(cfg)
        self.stats = stats.Stats(decay=cfg.ema_decay)
        self.next_prompt = 0
        self.deferred: list[int] = []

    def _draw(self, q: int) -> tuple[float, int, bool, float]:
        """(z, length, truncated, reward) of one candidate of prompt ``q``."""
        p = self.prompts[q]
        z = self.rng.gauss(0.0, 1.0)
        raw = math.exp(p.mu + p.sigma * z)
        truncated = raw >= self.cfg.max_tokens
        length = self.cfg.max_tokens if truncated else max(1, round(raw))
        # Pattern I: right when short. Pattern II: wrong when shallower than typical, no gain beyond.
        logit = p.a + self.cfg.workload.slope * (-z if p.sign < 0 else min(z, 0.0))
        correct = not truncated and self.rng.random() < 1.0 / (1.0 + math.exp(-logit))
        return z, length, truncated, 1.0 if correct else -1.0

    def _batch(self, size: int) -> list[int]:
        out = [(self.next_prompt + i) % self.cfg.prompts for i in range(size)]
        self.next_prompt += size
        return out

    def _place(self, pools: Sequence[int]) -> list[int]:
        """Replica of each prompt: whole pools, biggest first, onto the replica with fewest candidates."""
        load = [0] * self.cfg.replicas
        where = [0] * len(pools)
        for i in sorted(range(len(pools)), key=lambda i: (-pools[i], i)):
            r = min(range(len(load)), key=lambda r: (load[r], r))
            where[i], load[r] = r, load[r] + pools[i]
        return where

    def _train_s(self, lengths: Sequence[int], rollout_tokens: int) -> float:
        """Training time of the selected responses; with streaming, the exposed part only."""
        cfg = self.cfg
        rate = cfg.train_gpus * cfg.accelerator.tflops * 1e12 * cfg.train_mfu
        tokens = sum(lengths) + len(lengths) * cfg.workload.prompt_tokens
        actor = 6.0 * cfg.model.params * tokens / rate
        forwards = 2.0 * cfg.model.params * tokens / rate
        if self.system.streaming:
            tail = sum(min(n, cfg.chunk) for n in lengths if n > rollout_tokens - cfg.chunk)
            forwards *= (tail + len(lengths) * cfg.workload.prompt_tokens) / tokens
        return actor + forwards

    def _learn(self, q: int, zs: Sequence[float], rewards: Sequence[float], group: Sequence[int]) -> None:
        """One GRPO score-function step of prompt ``q``'s length policy on its selected group."""
        adv = selection.group_advantages(rewards, group)
        p, cfg = self.prompts[q], self.cfg
        g_mu = statistics.fmean(a * zs[j] for a, j in zip(adv, group, strict=True))
        g_sigma = statistics.fmean(a * (zs[j] ** 2 - 1.0) for a, j in zip(adv, group, strict=True))
        p.mu += cfg.lr_mu * p.sigma * g_mu
        p.sigma *= math.exp(cfg.lr_sigma * g_sigma)

    def _pools(self, batch: Sequence[int]) -> tuple[list[int], int]:
        cfg = self.cfg
        if not self.system.darts:
            return [cfg.group] * len(batch), len(batch) * cfg.group
        return plan.pools(
            self.stats, [str(q) for q in batch], self.ptl, m=cfg.group, m_up=cfg.m_up, lam=cfg.lam,
            replicas=cfg.replicas, adaptive=self.system.adaptive,
        )  # fmt: skip

    def step(self) -> tuple[Step, int]:
        """One synchronous step; (its record, samples trained)."""
        cfg, system = self.cfg, self.system
        tail_step = system.oversample and len(self.deferred) >= cfg.batch
        if tail_step:
            batch, self.deferred = self.deferred[: cfg.batch], self.deferred[cfg.batch :]
        elif system.oversample:
            batch = self._batch(math.ceil(cfg.batch * (1.0 + cfg.oversample)))
        else:
            batch = self._batch(cfg.batch)
        pools, total = self._pools(batch)
        draws = [[self._draw(q) for _ in range(pool)] for q, pool in zip(batch, pools, strict=True)]
        k = cfg.group - (system.long_end if system.long_end is not None else cfg.long_end)
        ends: list[list[int]] = []  # token count at which each candidate stops (finish or abort)
        groups: list[list[int]] = []
        saturated = 0
        for pool, ds in zip(pools, draws, strict=True):
            lengths, truncated = [d[1] for d in ds], [d[2] for d in ds]
            stop = [*lengths]
            if system.darts and selection.mode(pool, cfg.m_up) == selection.SHORTEST:
                saturated += 1
                valid = sorted(n for n, t in zip(lengths, truncated, strict=True) if not t)
                if len(valid) >= cfg.group:  # early stop at the M-th valid completion
                    stop = [min(n, valid[cfg.group - 1]) for n in lengths]
            ends.append(stop)
            groups.append(selection.select(lengths, truncated, cfg.group, k, m_up=cfg.m_up) if system.darts
                          else list(range(pool)))  # fmt: skip
        kept = list(range(len(batch)))
        if system.oversample and not tail_step:  # the first N groups to finish train; the rest wait
            kept = sorted(kept, key=lambda i: (max(ends[i]), i))[: cfg.batch]
            cutoff = max(ends[kept[-1]])
            ends = [[min(n, cutoff) for n in e] for e in ends]
            trained = set(kept)
            self.deferred += [batch[i] for i in range(len(batch)) if i not in trained]
        where = self._place(pools)
        replicas: list[list[float]] = [[] for _ in range(cfg.replicas)]
        for i, e in enumerate(ends):
            replicas[where[i]] += e
        rollout_s = budget.rollout_time_dp(replicas, self.ptl)
        observations: dict[str, stats.Observation] = {}
        selected_lengths: list[int] = []
        correct = 0
        for i in kept:
            q, ds, group, e = batch[i], draws[i], groups[i], ends[i]
            done = tuple(e[j] for j, d in enumerate(ds) if e[j] == d[1])
            aborted_at = tuple(e[j] for j, d in enumerate(ds) if e[j] < d[1])  # lower bounds
            observations[str(q)] = stats.Observation(done, aborted_at)
            selected_lengths += [ds[j][1] for j in group]
            correct += sum(ds[j][3] > 0 for j in group)
            self._learn(q, [d[0] for d in ds], [d[3] for d in ds], group)
        self.stats = stats.update(self.stats, observations)
        rollout_tokens = max((n for e in ends for n in e), default=0)
        train_s = self._train_s(selected_lengths, rollout_tokens)
        aborted = sum(n < d[1] for e, ds in zip(ends, draws, strict=True) for n, d in zip(e, ds, strict=True))
        record = Step(
            rollout_s=rollout_s,
            train_s=train_s,
            step_s=rollout_s + train_s + cfg.sync_s,
            candidates=sum(pools),
            aborted=aborted,
            saturated=saturated,
            budget=total,
            mean_length=statistics.fmean(selected_lengths) if selected_lengths else 0.0,
            accuracy=correct / len(selected_lengths) if selected_lengths else 0.0,
        )
        return record, len(kept) * cfg.group


def run(cfg: Config, system: System) -> Result:
    """``cfg.steps`` synchronous steps of ``system`` (SIMULATED)."""
    sim = _Run(cfg, system)
    steps, trained = [], 0
    for _ in range(cfg.steps):
        record, samples = sim.step()
        steps.append(record)
        trained += samples
    return Result(system.name, tuple(steps), trained)
