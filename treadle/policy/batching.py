"""Which stored trajectory groups form the next training batch, and which are too stale to keep.

Called by the buffer service (``treadle.services.buffer``) on every ``get_batch`` attempt and by the
simulator when its trainer asks for a batch. Both backends of the buffer (Redis, in-memory) turn
their records into the plain ``Group`` values below and apply the returned plan atomically.

Rules:

* **Whole groups** (GRPO needs every member's reward): a group is *ready* when all ``expected``
  members have arrived in a terminal state (completed, failed or aborted). Only its completed
  members are delivered; a ready group with no completed member is *empty* and is retired, never
  delivered (its failures stay counted in the buffer's stats).
* **Eviction** (RollArt §6.2, "before get_batch forms a training batch, it eagerly evicts stale
  trajectories"): a group whose oldest member was initiated under a version older than
  ``version - alpha`` is evicted whole.
* **Order**: oldest first by the sequence number the buffer gave the group's first member (ROLL
  ``GroupQueue`` takes oldest episodes first), so runs are reproducible.
* **Size**: groups are taken until at least ``batch_size`` completed trajectories are in; a batch can
  exceed ``batch_size`` by less than one group. Not enough ready -> ``None`` (the caller blocks).
* **Per-task weights** (RollArt §1.8 leaves batch composition open; we choose strict quotas): with
  weights, task t must contribute at least ``quota_t`` trajectories, where quotas split
  ``batch_size`` in proportion to the weights by largest remainder; tasks absent from the weights
  (or with weight 0) are never batched. If any quota cannot be met yet, ``None``.
* **Micro-batches** (FlexMARL §4.3): the same plan with ``min(micro_batch_size, remaining)`` as size,
  released as soon as it fills.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from treadle.errors import SpecError


@dataclasses.dataclass(frozen=True)
class Group:
    """One prompt group as stored: what arrived so far."""

    group_id: str
    task: str
    expected: int
    seq: int
    """Arrival order of the group's first member (smaller is older)."""
    min_version: int
    """Oldest policy version any arrived member was initiated under."""
    arrived: int
    completed: int


def is_ready(group: Group) -> bool:
    return group.arrived >= group.expected


def stale_groups(groups: Sequence[Group], *, version: int, alpha: int) -> list[str]:
    """Ids of groups to evict before forming a batch at ``version``, oldest first."""
    return [g.group_id for g in _oldest_first(groups) if g.min_version < version - alpha]


def empty_groups(groups: Sequence[Group]) -> list[str]:
    """Ready groups with nothing to train on (every member failed or was aborted)."""
    return [g.group_id for g in _oldest_first(groups) if is_ready(g) and g.completed == 0]


def quotas(batch_size: int, weights: Mapping[str, float]) -> dict[str, int]:
    """Split ``batch_size`` over tasks in proportion to ``weights`` (largest remainder, ties by name)."""
    for task, w in weights.items():
        if w < 0:
            raise SpecError("must be >= 0", field=f"task_weights.{task}", value=w)
    positive = {t: w for t, w in weights.items() if w > 0}
    if not positive:
        raise SpecError("at least one task needs a weight > 0", field="task_weights", value=dict(weights))
    total = sum(positive.values())
    exact = {t: batch_size * w / total for t, w in positive.items()}
    out = {t: int(x) for t, x in exact.items()}
    short = batch_size - sum(out.values())
    for t in sorted(exact, key=lambda t: (-(exact[t] - out[t]), t))[:short]:
        out[t] += 1
    return out


def plan_batch(
    groups: Sequence[Group],
    *,
    batch_size: int,
    task_weights: Mapping[str, float] | None = None,
) -> list[str] | None:
    """Group ids (oldest first) forming the next batch, or ``None`` if it cannot be formed yet.

    ``groups`` should already exclude stale ones (``stale_groups``); empty groups are skipped.
    """
    if batch_size <= 0:
        raise SpecError("must be > 0", field="batch_size", value=batch_size)
    ready = [g for g in _oldest_first(groups) if is_ready(g) and g.completed > 0]
    if not task_weights:
        return _take(ready, batch_size)
    chosen: list[Group] = []
    for task, quota in sorted(quotas(batch_size, task_weights).items()):
        if quota == 0:
            continue
        picked = _take([g for g in ready if g.task == task], quota)
        if picked is None:
            return None
        chosen.extend(g for g in ready if g.group_id in set(picked))
    return [g.group_id for g in _oldest_first(chosen)]


def plan_micro_batch(
    groups: Sequence[Group],
    *,
    micro_batch_size: int,
    remaining: int,
    task_weights: Mapping[str, float] | None = None,
) -> list[str] | None:
    """The next micro-batch of a batch that still needs ``remaining`` trajectories."""
    if micro_batch_size <= 0:
        raise SpecError("must be > 0", field="micro_batch_size", value=micro_batch_size)
    if remaining <= 0:
        return None
    return plan_batch(groups, batch_size=min(micro_batch_size, remaining), task_weights=task_weights)


def drain(
    groups: Sequence[Group],
    *,
    batch_size: int,
    task_weights: Mapping[str, float] | None = None,
    max_batches: int = 10_000,
) -> list[list[str]]:
    """Every batch that ``groups`` yields in turn, as the buffer would hand them out (tests, sim)."""
    left = list(groups)
    out: list[list[str]] = []
    for _ in range(max_batches):
        plan = plan_batch(left, batch_size=batch_size, task_weights=task_weights)
        if plan is None:
            break
        out.append(plan)
        taken = set(plan)
        left = [g for g in left if g.group_id not in taken]
    return out


def _take(ready: Sequence[Group], size: int) -> list[str] | None:
    picked: list[str] = []
    count = 0
    for g in ready:
        if count >= size:
            break
        picked.append(g.group_id)
        count += g.completed
    return picked if count >= size else None


def _oldest_first(groups: Sequence[Group]) -> list[Group]:
    return sorted(groups, key=lambda g: (g.seq, g.group_id))
