"""DARTS group shaping (§4.1.2, §4.3.1, Alg. 2): which candidates of a prompt's pool form its GRPO group.

Called by the simulator (``treadle.sim.darts``) per prompt and step, and by the live scheduler/buffer
once it lands. Inputs are the pool's recorded lengths (tokens by default; see docs/DARTS.md) and
whether each candidate was truncated (``finish_reason=length``); outputs are indices into the pool.

* **Dual-end** (``select_dual_end``): the ``k`` shortest, plus the ``L = m - k`` longest candidates
  *not truncated* among the rest (default 7 + 1 of 8). The edge cases the paper leaves open (digest
  §2.2) are decided here: (a) fewer than ``L`` non-truncated candidates remain -> the gap is filled
  with the shortest remaining candidates, which are then all truncated and carry DAPO's overlong
  penalty; (b) a truncated candidate among the ``k`` shortest stays (it is only possible when most
  of the pool truncated, and its penalty is signal); (c) equal lengths are ordered by pool index.
  The pool index is launch (or completion) order, which carries no information about the sample,
  so it acts as the paper's random tie-break without an RNG, and a test can pin the result.
* **Shortest-only** for prompts whose budget saturated (``mode`` is ``SHORTEST``): the ``m``
  shortest, with **early stop** (``enough_valid``): once ``m`` valid (non-truncated) completions are
  in, the rest of the pool is aborted. Since a prompt's candidates decode together, the first ``m``
  to finish are its ``m`` shortest.
* ``group_advantages``: GRPO advantages over the selected group only (never the pool), the same
  function the trainer uses (``treadle.policy.grpo``).

With a pool of exactly ``m`` every rule selects the whole pool in pool order: standard GRPO.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from treadle import errors
from treadle.policy import grpo

DUAL_END: Literal["dual-end"] = "dual-end"
SHORTEST: Literal["shortest"] = "shortest"
Mode = Literal["dual-end", "shortest"]


def mode(pool: int, m_up: int) -> Mode:
    """Shortest-only with early stop once the prompt's pool reached the cap (budget saturation, §4.3.1)."""
    return SHORTEST if pool >= m_up else DUAL_END


def _check(lengths: Sequence[int], truncated: Sequence[bool], m: int, k: int) -> None:
    if len(truncated) != len(lengths):
        raise errors.SpecError(
            f"{len(truncated)} flags for {len(lengths)} lengths", field="truncated", value=len(truncated)
        )
    if m < 1:
        raise errors.SpecError("must be >= 1", field="m", value=m)
    if len(lengths) < m:
        raise errors.SpecError(
            f"the pool holds {len(lengths)} < m = {m}", field="lengths", value=len(lengths)
        )
    if not 0 <= k <= m:
        raise errors.SpecError(f"must be in [0, m = {m}]", field="k", value=k)


def select_dual_end(lengths: Sequence[int], truncated: Sequence[bool], m: int, k: int) -> list[int]:
    """Indices (ascending) of the ``k`` shortest plus the ``m - k`` longest non-truncated of the rest."""
    _check(lengths, truncated, m, k)
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    short, rest = order[:k], order[k:]
    valid = sorted((i for i in rest if not truncated[i]), key=lambda i: (-lengths[i], i))
    long = valid[: m - k]
    if len(long) < m - k:  # edge case (a): backfill with the shortest left, all truncated here
        taken = set(long)
        long += [i for i in rest if i not in taken][: m - k - len(long)]
    return sorted(short + long)


def select_shortest(lengths: Sequence[int], truncated: Sequence[bool], m: int) -> list[int]:
    """Indices (ascending) of the ``m`` shortest (shortest-only mode; truncated ones are the longest)."""
    return select_dual_end(lengths, truncated, m, m)


def select(lengths: Sequence[int], truncated: Sequence[bool], m: int, k: int, *, m_up: int) -> list[int]:
    """The group of a finished (or early-stopped) pool, by its ``mode``."""
    if mode(len(lengths), m_up) == SHORTEST:
        return select_shortest(lengths, truncated, m)
    return select_dual_end(lengths, truncated, m, k)


def enough_valid(truncated_done: Sequence[bool], m: int) -> bool:
    """Early stop (§4.3.1): ``m`` completions that did not hit the length limit are in."""
    return sum(not t for t in truncated_done) >= m


def group_advantages(rewards: Sequence[float], selected: Sequence[int]) -> list[float]:
    """GRPO advantages of the selected members (in ``selected`` order), normalised over them only."""
    chosen = [rewards[i] for i in selected]
    return grpo.group_advantages(chosen, ["selected"] * len(chosen))
