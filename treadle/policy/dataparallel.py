"""How a training batch's sequences are split across data-parallel ranks and into micro-batches.

Called by the reference trainer (``treadle.trainer.step``) on every rank with the same inputs, so
every rank computes the same plan without talking to the others. Costs are tokens (prompt plus
output: a forward and backward pass costs about that, and so does its activation memory).

- ``split_ranks``: the longest-processing-time rule (each sequence, longest first, goes to the rank
  with the fewest tokens so far; ties go to the lower rank). Its makespan is within 4/3 of the best
  (Graham, 1969); verl's ``rearrange_micro_batches`` balances the same way (Karmarkar-Karp there).
  The step ends when the slowest rank ends, so the largest rank total is what to minimise.
- ``split_micro``: one rank's sequences packed in order into micro-batches of at most
  ``token_budget`` tokens (a sequence longer than the budget gets a micro-batch of its own), and
  padded with empty micro-batches to ``count``: FSDP runs one all-gather per forward and one
  reduce-scatter per backward, so every rank must run the same number of micro-batches, and the
  trainer makes ``count`` the largest any rank needs.
"""

from __future__ import annotations

from collections.abc import Sequence

from treadle.errors import SpecError


def split_ranks(costs: Sequence[int], ranks: int) -> list[list[int]]:
    """Indices of ``costs`` for each of ``ranks`` ranks, balanced by total cost; each list ascending.

    A rank may get nothing when there are fewer sequences than ranks (the trainer then runs a
    zero-weight micro-batch on it, so the collectives still match)."""
    if ranks < 1:
        raise SpecError("must be >= 1", field="ranks", value=ranks)
    if any(c < 0 for c in costs):
        raise SpecError("token costs must be >= 0", field="costs", value=list(costs))
    loads = [0] * ranks
    out: list[list[int]] = [[] for _ in range(ranks)]
    for index in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        rank = min(range(ranks), key=lambda r: (loads[r], r))
        out[rank].append(index)
        loads[rank] += costs[index]
    return [sorted(indices) for indices in out]


def split_micro(costs: Sequence[int], token_budget: int | None) -> list[list[int]]:
    """Positions of ``costs`` in micro-batches of at most ``token_budget`` tokens, in order.

    ``None``: one micro-batch with everything. Never returns an empty list for non-empty costs."""
    if token_budget is not None and token_budget < 1:
        raise SpecError("must be >= 1 (or unset)", field="token_budget", value=token_budget)
    if token_budget is None:
        return [list(range(len(costs)))] if costs else []
    out: list[list[int]] = []
    used = 0
    for i, cost in enumerate(costs):
        if out and used + cost <= token_budget:
            out[-1].append(i)
            used += cost
        else:
            out.append([i])
            used = cost
    return out


def pad_micro(micro: list[list[int]], count: int) -> list[list[int]]:
    """``micro`` followed by empty micro-batches up to ``count`` (see the module's docstring)."""
    if count < len(micro):
        raise SpecError(f"must be >= {len(micro)} micro-batches", field="count", value=count)
    return micro + [[] for _ in range(count - len(micro))]
