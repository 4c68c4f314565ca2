"""Process setup shared by the services' ``__main__`` modules (and the benchmarks that stand in for them)."""

from __future__ import annotations

import gc

FULL_COLLECTION_EVERY = 1000
"""Young (generation 1) collections between full ones; CPython's default is 10."""


def settle_heap() -> None:
    """Call once startup is done: park what it built where the cyclic GC no longer walks it.

    ``gc.freeze`` moves every object alive now (modules, classes, compiled pydantic and protobuf
    schemas, the service's own clients: 66k in the scheduler benchmark) to the permanent generation;
    nothing the hot path does makes them garbage, but every full collection walked them. Full
    collections are also made 100x rarer: per-turn garbage dies young (generations 0 and 1 collect it
    as before), and what survives to generation 2 is mostly live state (trajectories in flight),
    which a full collection walks without freeing. In ``bench/dataplane_scheduler_overhead.py``
    (2,000 trajectories in flight) the scheduler went from 9 full collections a run, up to 730 ms
    each with every turn waiting behind them, to none.
    """
    gc.collect()
    gc.freeze()
    # Young thresholds stay CPython's. 10x fewer generation-0 collections cut the scheduler's GC CPU
    # by a third (1.7 -> 1.1 s a run, two interleaved rounds) but each pause grew 10x, to 15 ms
    # (generation 0) and 76 ms (generation 1) of CPU, every turn in the loop's queue waiting behind it.
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, FULL_COLLECTION_EVERY)
