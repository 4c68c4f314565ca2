"""Resource status as Alg. 1 sees it: one pool per resource type, with its manager's topology.

The paper's ``R.accommodate(W[:i])`` is "topology-aware": enough units in total *and* a placement
that holds them all. Each pool answers it incrementally (``take``: the admission state after one
more action's minimum, ``None`` once it no longer fits) and hands Alg. 3 its DP operator for what
is left after amounts promised elsewhere:

* ``FlatPool``: interchangeable units (the cores of one CPU node, an API's concurrency slots, the
  requests left in an API quota window). The CPU manager runs one scheduler per node (§5.2), so a
  node's cores are one flat pool; which cores is ``cores.pick``'s job after the decision.
* ``ChunkPool``: GPUs in aligned buddy chunks (``buddy``); the admission state is the multiset of
  chunk sizes promised so far.

Built by the shell from its manager's state at every scheduling round.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

from treadle.errors import SpecError
from treadle.policy.tangram import buddy, dparrange


class Pool(Protocol):
    @property
    def total(self) -> int:
        """All units of the type, busy or not (the completion heap has one entry per unit)."""
        ...

    def start(self) -> Any:
        """The admission state with nothing promised."""
        ...

    def take(self, state: Any, amount: int) -> Any | None:
        """The admission state after promising ``amount`` more, ``None`` if it does not fit."""
        ...

    def operator(self, state: Any, most: int) -> dparrange.Operator:
        """Alg. 3's operator over what is left after ``state`` (at most ``most`` grants)."""
        ...


@dataclasses.dataclass(frozen=True)
class FlatPool:
    free: int
    total: int

    def __post_init__(self) -> None:
        if not 0 <= self.free <= self.total:
            raise SpecError("needs 0 <= free <= total", field="pool", value=(self.free, self.total))

    def start(self) -> int:
        return 0

    def take(self, state: int, amount: int) -> int | None:
        used = state + amount
        return used if used <= self.free else None

    def operator(self, state: int, most: int) -> dparrange.Operator:
        return dparrange.FlatOperator(self.free - state)


@dataclasses.dataclass(frozen=True)
class ChunkPool:
    free: buddy.Inventory
    """Free chunks per size (1, 2, 4, 8): ``buddy.inventory`` of the GPU manager's pool."""
    total: int

    def start(self) -> buddy.Inventory:
        return (0, 0, 0, 0)

    def take(self, state: buddy.Inventory, amount: int) -> buddy.Inventory | None:
        if amount == 0:
            return state
        i = buddy.SIZES.index(buddy.level(amount))
        demand = list(state)
        demand[i] += 1
        want = (demand[0], demand[1], demand[2], demand[3])
        return want if buddy.fits(self.free, want) else None

    def operator(self, state: buddy.Inventory, most: int) -> dparrange.Operator:
        return dparrange.ChunkOperator(self.free, state, most)
