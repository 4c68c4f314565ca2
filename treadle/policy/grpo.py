"""GRPO's group-relative advantages: ``(r - mean(group)) / (std(group) + eps)`` per sample.

Pure arithmetic shared by the trainer (``treadle.trainer.grpo`` re-exports it for its loss) and by
DARTS (``treadle.policy.darts.selection``: advantages over the *selected* group only) and its
simulator, so the advantages DARTS reasons about are the ones the trainer computes.

``scale=False`` drops the division (Dr. GRPO), which keeps groups with tiny reward spread from being
blown up. A group whose rewards are all equal carries no signal and gets 0 either way.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from treadle import errors


def group_advantages(
    rewards: Sequence[float], groups: Sequence[str], *, scale: bool = True, eps: float = 1e-6
) -> list[float]:
    """Per-sample advantage relative to the sample's group (population std, as GRPO computes it)."""
    if len(rewards) != len(groups):
        raise errors.SpecError(f"{len(rewards)} rewards for {len(groups)} group ids", field="groups")
    members: dict[str, list[float]] = {}
    for r, g in zip(rewards, groups, strict=True):
        if not math.isfinite(r):
            raise errors.SpecError(f"reward {r!r} is not finite", field="rewards", value=r)
        members.setdefault(g, []).append(r)
    stats: dict[str, tuple[float, float]] = {}
    for g, rs in members.items():
        mean = sum(rs) / len(rs)
        std = math.sqrt(sum((r - mean) ** 2 for r in rs) / len(rs))
        stats[g] = (mean, std)
    out = []
    for r, g in zip(rewards, groups, strict=True):
        mean, std = stats[g]
        centred = r - mean
        if std == 0.0:
            out.append(0.0)  # all rewards equal: no signal, and no 0/0 when eps is 0
        else:
            out.append(centred / (std + eps) if scale else centred)
    return out
