"""The CPU manager's placement (§5.2): a trajectory's node, and an action's exclusive core set.

* ``place``: at a trajectory's first action, the nodes with enough free cores for the action and
  enough free memory for the *whole* trajectory; among them the one with the lowest CPU-memory
  load (ours, where the paper says only "a CPU memory load-balancing policy": the larger of the
  node's busy-core and reserved-memory fractions after placing, ties to the lower index). Every
  later action of the trajectory runs on that node, so each node runs its own scheduler.
* ``pick``: the exact cores of a grant. Each core serves one action at a time; elastic actions
  get cores of one NUMA domain when one has room (the fullest that fits: keeps big free runs for
  later), else the domains with most free cores first.

Pure: the shell keeps the free core sets and memory per node.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from treadle.errors import SpecError


@dataclasses.dataclass(frozen=True)
class Node:
    free_cores: int
    cores: int
    free_memory_gb: float
    memory_gb: float


def place(nodes: Sequence[Node], *, cores: int, memory_gb: float) -> int | None:
    """The node index for a new trajectory, ``None`` if no node has room now."""
    best: tuple[float, int] | None = None
    for i, n in enumerate(nodes):
        if n.free_cores < cores or n.free_memory_gb < memory_gb:
            continue
        load = max(
            1 - (n.free_cores - cores) / n.cores,
            1 - (n.free_memory_gb - memory_gb) / n.memory_gb,
        )
        if best is None or load < best[0]:
            best = (load, i)
    return None if best is None else best[1]


def pick(free_by_domain: Sequence[Sequence[int]], count: int) -> tuple[int, ...]:
    """``count`` free cores (ids from ``free_by_domain``, one list per NUMA domain), sorted."""
    if count < 1 or count > sum(len(d) for d in free_by_domain):
        raise SpecError("needs 1 <= count <= free cores", field="count", value=count)
    fitting = [d for d in free_by_domain if len(d) >= count]
    if fitting:
        return tuple(sorted(min(fitting, key=len)[:count]))
    chosen: list[int] = []
    for d in sorted(free_by_domain, key=len, reverse=True):
        chosen += d[: count - len(chosen)]
        if len(chosen) == count:
            break
    return tuple(sorted(chosen))
