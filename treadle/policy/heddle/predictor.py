"""Online remaining-length predictor learned from finished trajectories (Heddle §4.1, our default).

Called by the scheduler after every step of a trajectory (the prediction feeds ``priority`` and
``migration``) and by the simulator. ``learn`` is called with each batch of finished trajectories
and returns a new model; nothing is mutated, so a service can swap models atomically.

Heddle fine-tunes Qwen3-0.6B as a regressor over the text context (0.1-0.28 s per call, Table 1).
That needs a GPU service; this module is the fast pluggable default the issue asks for, a
history-based estimator of the kind the paper compares against (RhymeRL / Seer), made progressive
by conditioning on what the trajectory has already generated. ``Predictor`` is the seam for a
model-based replacement.

Estimate, for a trajectory of task ``k`` and GRPO group ``g`` that has generated ``x`` tokens in
``s`` steps::

    r_task(x, s) = mean{T - D_s : the `neighbours` finished trajectories of k with more than s
                   steps whose tokens after s steps, D_s, are closest to x}         (s >= 1)
    r_task(x, 0) = mean{T - x : T in window(k), T > x}      (mean residual life; also the fallback
                                                              when too few went past step s)
    r_group(x)   = mean{T - x : T in finished siblings(g), T > x}                  (n_g of them)
    predict      = (n_g · r_group + k · r_task) / (n_g + k)

``k`` is ``shrink`` (4 by default) or, with ``shrink=None`` (the live scheduler's choice),
Bühlmann's credibility constant estimated from the kept groups' finished lengths (the
Bühlmann-Straub estimators for unequal group sizes): ``k = EPV / VHM``, the within-group variance
of lengths over the variance of the groups' true means. Siblings that end alike (``EPV`` small
against ``VHM``) make the group term count almost fully; groups whose means differ no more than
chance allows (``VHM <= 0``) make it count not at all; until two groups have two finished members
each, ``k = PRIOR_SHRINK``. A fixed ``k`` pulls every prompt towards the task mean whatever the
data say: on ``bench/heddle_live.py``, whose siblings end alike, a 1,536-token trajectory was
predicted 674-889 tokens and a 32-token one 137-172 (``bench/reports/heddle-live.md``). The
simulator keeps the fixed default: there the estimate shortens Heddle's makespan (0-22 % in
``tests/unit/sim/test_heddle_sim.py``'s four seeds) but moves its TP plans to fewer, wider
workers, where the placement ablation that test pins has little left to do.

Conditioning on progress per step is what makes it progressive: a trajectory whose first steps were
long (a hard plan) is compared with the finished ones that started as long, the history analogue of
the paper's "the initial step's execution plan serves as a strong semantic indicator".

Choices of ours (the paper is silent): the window keeps the latest ``window`` trajectories per
task, so the estimate follows policy drift; a trajectory already longer than every finished one
is predicted to run as long again (``x``), the heavy-tail (Lindy) guess, which keeps it at the
front of an LPT queue; with no history at all the prediction is ``prior``. Cost per prediction:
two binary searches, ``O(log window)``; ``learn`` splices the batch into the task's sorted indexes
(what entered and what fell out of the window) instead of re-sorting them.

Known limit (measured in the unit test on a synthetic task): siblings finished so far are the
group's short ones, so once a trajectory has outrun them the group term falls back to the task,
and trajectories of one group at one progress point get one number. Ranking inside a group needs
the text, which is what the paper's model reads; plug such a model in through ``Predictor``.
"""

from __future__ import annotations

import bisect
import dataclasses
import fractions
import itertools
import math
import operator
from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Protocol

from treadle.errors import SpecError


@dataclasses.dataclass(frozen=True)
class Finished:
    """A finished trajectory: the training example of the predictor."""

    task: str
    group_id: str
    total_tokens: int
    step_tokens: tuple[int, ...] = ()
    """Tokens generated per step, if known (they sum to ``total_tokens``); enables step conditioning."""


@dataclasses.dataclass(frozen=True)
class Observation:
    """A running trajectory at a step boundary (it has made a tool call, so another step follows)."""

    task: str
    group_id: str
    tokens_so_far: int
    steps_done: int = 0


class Predictor(Protocol):
    """Anything that predicts the tokens a trajectory still has to generate."""

    def predict(self, obs: Observation) -> float: ...


PRIOR_SHRINK = 4.0
"""``k`` by default, and with ``shrink=None`` until the history can estimate it."""
_SORT_SHARE = 4
"""A batch adding more than 1/``_SORT_SHARE`` of an index's size re-sorts it, not inserting one by one."""


@dataclasses.dataclass(frozen=True)
class _Index:
    """(key, value) pairs in sorted order, as parallel lists, with prefix sums of the values.

    The lists are never mutated once the index is built (``changed`` works on copies), so a model
    stays as it was; lists, not tuples, because converting each copy to a tuple was a fifth of
    ``learn``'s time (a batch of 1 into a full window, interleaved runs: 273-296 -> 216-218 us).

    The lengths of finished trajectories are indexed with key = value = total tokens; the trajectories
    past step ``s`` with key = tokens after ``s`` steps, value = the tokens that followed.
    """

    keys: list[int] = dataclasses.field(default_factory=list)
    values: list[int] = dataclasses.field(default_factory=list)
    prefix: list[int] = dataclasses.field(default_factory=lambda: [0])
    """``prefix[i] = sum(values[:i])``. Ints: exact, so a prefix patched from index ``i`` on equals a
    rebuilt one, and sums of token counts stay far below where floats would round."""

    @staticmethod
    def of(pairs: Iterable[tuple[int, int]]) -> _Index:
        ordered = sorted(pairs)
        values = list(map(operator.itemgetter(1), ordered))
        return _Index(
            keys=list(map(operator.itemgetter(0), ordered)),
            values=values,
            prefix=list(itertools.accumulate(values, initial=0)),
        )

    def changed(self, added: Sequence[tuple[int, int]], removed: Sequence[tuple[int, int]]) -> _Index:
        """A new index without ``removed`` (each present) and with ``added``; this one stays as it is.

        Splices the few changed pairs into copies (memory moves, no re-sort) and recomputes the prefix
        sums only from the first changed position on: ``learn`` runs on the scheduler's event loop.
        """
        if not added and not removed:
            return self
        keys, values = list(self.keys), list(self.values)
        low = len(keys)
        for pair in removed:
            i = _position(keys, values, pair)
            del keys[i], values[i]
            low = min(low, i)
        if len(added) * _SORT_SHARE > len(keys):
            return _Index.of(itertools.chain(zip(keys, values, strict=True), added))
        for pair in added:
            i = _position(keys, values, pair)
            keys.insert(i, pair[0])
            values.insert(i, pair[1])
            low = min(low, i)
        tail = itertools.accumulate(itertools.islice(values, low, None), initial=self.prefix[low])
        prefix = self.prefix[:low]
        prefix.extend(tail)
        return _Index(keys=keys, values=values, prefix=prefix)

    def residual(self, x: int) -> tuple[float, int]:
        """(mean of ``value - x`` over ``key > x``, how many ``key > x``); with key = value the mean
        residual life."""
        i = bisect.bisect_right(self.keys, x)
        above = len(self.keys) - i
        if above == 0:
            return 0.0, 0
        return (self.prefix[-1] - self.prefix[i]) / above - x, above

    def neighbours(self, x: int, k: int) -> float:
        """Mean value of the ``k`` entries whose keys are closest to ``x``."""
        keys = self.keys
        k = min(k, len(keys))
        # the k closest form a window [lo, lo + k); binary search its start (ties to the left)
        lo, hi = 0, len(keys) - k
        while lo < hi:
            mid = (lo + hi) // 2
            if x - keys[mid] > keys[mid + k] - x:
                lo = mid + 1
            else:
                hi = mid
        return (self.prefix[lo + k] - self.prefix[lo]) / k


def _position(keys: list[int], values: list[int], pair: tuple[int, int]) -> int:
    """Where ``pair`` is, or would go, in the pairs sorted as ``(key, value)``."""
    lo = bisect.bisect_left(keys, pair[0])
    return bisect.bisect_left(values, pair[1], lo, bisect.bisect_right(keys, pair[0], lo))


@dataclasses.dataclass(frozen=True)
class _Task:
    recent: tuple[Finished, ...]
    """The window, in arrival order."""
    lengths: _Index
    by_step: tuple[_Index, ...]
    """``by_step[s - 1]`` conditions on ``s`` steps done, ``s = 1..max_steps``."""

    @staticmethod
    def empty(max_steps: int) -> _Task:
        return _Task(recent=(), lengths=_Index(), by_step=(_Index(),) * max_steps)

    def changed(
        self, recent: tuple[Finished, ...], entered: Sequence[Finished], left: Sequence[Finished]
    ) -> _Task:
        """The task with window ``recent``: ``entered`` joined it and ``left`` fell out of it."""
        by_step = []
        for s, index in enumerate(self.by_step, start=1):
            by_step.append(index.changed(_past_step(entered, s), _past_step(left, s)))
        return _Task(
            recent=recent,
            lengths=self.lengths.changed(_totals(entered), _totals(left)),
            by_step=tuple(by_step),
        )


def _totals(finished: Sequence[Finished]) -> list[tuple[int, int]]:
    return [(f.total_tokens, f.total_tokens) for f in finished]


def _past_step(finished: Sequence[Finished], s: int) -> list[tuple[int, int]]:
    """(tokens after ``s`` steps, tokens after that) of those that went past step ``s``."""
    out = []
    for f in finished:
        if len(f.step_tokens) > s:
            done = sum(f.step_tokens[:s])
            out.append((done, f.total_tokens - done))
    return out


@dataclasses.dataclass(frozen=True)
class _Spread:
    """Sums over the kept groups' finished lengths, from which ``credibility`` estimates ``k``.

    Exact (ints and a fraction), so adding and removing groups in any order gives the same ``k`` as a
    rebuild.
    """

    n: int = 0
    """Finished trajectories over all kept groups."""
    groups: int = 0
    repeated: int = 0
    """Groups with at least two finished members (the ones that show within-group variance)."""
    total: int = 0
    squares: int = 0
    """Sum of the squared lengths."""
    group_squares: fractions.Fraction = fractions.Fraction(0)
    """Sum over groups of (sum of its lengths)² / its size."""
    sizes_squared: int = 0

    def changed(self, lengths: Sequence[int], sign: int) -> _Spread:
        """With one group's ``lengths`` added (``sign`` 1) or removed (-1)."""
        size = len(lengths)
        if size == 0:
            return self
        total = sum(lengths)
        return _Spread(
            n=self.n + sign * size,
            groups=self.groups + sign,
            repeated=self.repeated + sign * (size >= 2),
            total=self.total + sign * total,
            squares=self.squares + sign * sum(x * x for x in lengths),
            group_squares=self.group_squares + sign * fractions.Fraction(total * total, size),
            sizes_squared=self.sizes_squared + sign * size * size,
        )

    def credibility(self) -> float | None:
        """Bühlmann's ``k = EPV / VHM`` (``inf``: groups tell nothing); ``None`` while not estimable."""
        if self.repeated < 2:
            return None
        within = (self.squares - self.group_squares) / (self.n - self.groups)
        between = self.group_squares - fractions.Fraction(self.total * self.total, self.n)
        spread = (between - (self.groups - 1) * within) / (
            self.n - fractions.Fraction(self.sizes_squared, self.n)
        )
        if spread <= 0:
            return math.inf
        return float(within / spread)


def _no_tasks() -> Mapping[str, _Task]:
    return MappingProxyType({})


def _empty() -> Mapping[str, _Index]:
    return MappingProxyType({})


@dataclasses.dataclass(frozen=True)
class HistoryModel:
    """The default predictor. Build with ``HistoryModel()`` and feed it with ``learn``."""

    window: int = 2048
    """Finished trajectories kept per task (most recent)."""
    groups_kept: int = 4096
    """Groups whose sibling lengths are kept (most recently finished)."""
    shrink: float | None = PRIOR_SHRINK
    """Weight ``k`` of the task estimate against ``n_g`` finished siblings; ``None``: estimated (doc)."""
    prior: float = 0.0
    """Prediction when the task has no history yet (0 ranks such trajectories by arrival)."""
    neighbours: int = 32
    """Finished trajectories with the closest progress that a step-conditioned estimate averages."""
    max_steps: int = 16
    """Step counts conditioned on; later steps use this one."""
    tasks: Mapping[str, _Task] = dataclasses.field(default_factory=_no_tasks)
    groups: Mapping[str, _Index] = dataclasses.field(default_factory=_empty)
    """Per group, its finished siblings' lengths (key = value = total tokens)."""
    spread: _Spread = _Spread()
    """The kept groups' sums, for ``k``."""
    k: float | None = None
    """The estimated credibility constant (``None``: not yet estimable)."""

    def __post_init__(self) -> None:
        for name in ("window", "groups_kept", "neighbours", "max_steps"):
            if getattr(self, name) < 1:
                raise SpecError("must be at least 1", field=name, value=getattr(self, name))
        if self.shrink is not None and not self.shrink > 0:
            raise SpecError("must be positive", field="shrink", value=self.shrink)
        if not (self.prior >= 0 and math.isfinite(self.prior)):
            raise SpecError("must be a finite number >= 0", field="prior", value=self.prior)

    def predict(self, obs: Observation) -> float:
        """Predicted tokens still to generate after ``obs.tokens_so_far``."""
        x = obs.tokens_so_far
        history = self.tasks.get(obs.task)
        if history is None:
            return self.prior
        step = min(obs.steps_done, self.max_steps)
        index = history.by_step[step - 1] if step >= 1 else None
        if index is not None and len(index.keys) >= self.neighbours:
            r_task = index.neighbours(x, self.neighbours)
        else:
            r_task, above = history.lengths.residual(x)
            if above == 0:
                r_task = float(max(x, 1))  # longer than anything seen: guess it runs as long again
        siblings = self.groups.get(obs.group_id)
        if siblings is None:
            return r_task
        r_group, n_g = siblings.residual(x)
        k = self.shrink if self.shrink is not None else PRIOR_SHRINK if self.k is None else self.k
        if n_g == 0 or math.isinf(k):
            return r_task
        return (n_g * r_group + k * r_task) / (n_g + k)


def learn(model: HistoryModel, finished: Sequence[Finished]) -> HistoryModel:
    """A new model that also knows ``finished`` (the oldest fall out of the windows)."""
    for i, f in enumerate(finished):
        if f.total_tokens < 0:
            raise SpecError("must be >= 0", field=f"finished[{i}].total_tokens", value=f.total_tokens)
        if f.step_tokens and (sum(f.step_tokens) != f.total_tokens or min(f.step_tokens) < 0):
            raise SpecError(
                "must be >= 0 and sum to total_tokens",
                field=f"finished[{i}].step_tokens",
                value=f.step_tokens,
            )
    tasks = dict(model.tasks)
    groups = dict(model.groups)
    by_task: dict[str, list[Finished]] = {}
    by_group: dict[str, list[int]] = {}
    for f in finished:
        by_task.setdefault(f.task, []).append(f)
        by_group.setdefault(f.group_id, []).append(f.total_tokens)
    for task, new in by_task.items():
        before = tasks.get(task) or _Task.empty(model.max_steps)
        entered = tuple(new)[-model.window :]
        recent = (before.recent + entered)[-model.window :]
        kept = len(recent) - len(entered)
        tasks[task] = before.changed(recent, entered, before.recent[: len(before.recent) - kept])
    spread = model.spread
    for group, totals in by_group.items():
        siblings = groups.pop(group, _Index())
        groups[group] = siblings.changed(
            [(t, t) for t in totals], ()
        )  # re-inserted: dicts keep insertion order
        spread = spread.changed(siblings.values, -1).changed(groups[group].values, 1)
    for stale in list(groups)[: max(0, len(groups) - model.groups_kept)]:
        spread = spread.changed(groups.pop(stale).values, -1)
    return dataclasses.replace(
        model,
        tasks=MappingProxyType(tasks),
        groups=MappingProxyType(groups),
        spread=spread,
        k=spread.credibility(),
    )


@dataclasses.dataclass(frozen=True)
class Accuracy:
    """Prediction error against what actually happened (Heddle Fig. 13's metrics plus MAE)."""

    n: int
    mae: float
    """Mean absolute error, tokens."""
    median_ratio_error: float
    """Median of ``max(p, a) / min(p, a)`` (with both floored at 1 token): 1.0 is perfect."""
    pearson: float
    long_tail_recall: float
    """Share of the actual top ``tail`` fraction that is also in the predicted top ``tail``."""


def accuracy(predicted: Sequence[float], actual: Sequence[float], *, tail: float = 0.1) -> Accuracy:
    """Score predictions of remaining length against the true remaining lengths."""
    if len(predicted) != len(actual) or not predicted:
        raise SpecError("needs equally long, non-empty sequences", field="predicted", value=len(predicted))
    if not 0 < tail <= 1:
        raise SpecError("must be in (0, 1]", field="tail", value=tail)
    n = len(actual)
    mae = sum(abs(p - a) for p, a in zip(predicted, actual, strict=True)) / n
    ratios = sorted(max(p, a, 1.0) / max(min(p, a), 1.0) for p, a in zip(predicted, actual, strict=True))
    k = max(1, round(tail * n))
    top_actual = set(sorted(range(n), key=lambda i: (-actual[i], i))[:k])
    top_pred = set(sorted(range(n), key=lambda i: (-predicted[i], i))[:k])
    return Accuracy(
        n=n,
        mae=mae,
        median_ratio_error=ratios[n // 2],
        pearson=_pearson(predicted, actual),
        long_tail_recall=len(top_actual & top_pred) / k,
    )


def _pearson(xs: Sequence[float], ys: Sequence[float]) -> float:
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    sxx = sum((x - mx) ** 2 for x in xs)
    syy = sum((y - my) ** 2 for y in ys)
    return sxy / math.sqrt(sxx * syy) if sxx > 0 and syy > 0 else 0.0
