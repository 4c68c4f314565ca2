"""The GPU manager's pool (§5.3): aligned buddy chunks, cache affinity, LRU service eviction.

A *chunk* is a GPU interval ``[start, start + 2^a)`` of one node with ``2^a`` dividing ``start``
(the paper prints "start | 2^a"; digest bug #9), ``a ∈ {0, 1, 2, 3}``; each node starts as one free
chunk ``(0, 8)``. To allocate ``m`` GPUs (``m ∈ {1, 2, 4, 8}``) the manager takes the smallest free
chunk of a level ``b >= a``, splits it down to ``2^a`` and returns one part. Among free chunks of that
level it prefers one that already caches the requested service variant (cache affinity), then the
lowest ``(node, start)``. A freed chunk merges with its buddy while the buddy is free (HiveD does,
the paper does not say; digest §1.11).

Every service variant (a service at one degree of parallelism: ``judge@tp4``) is backed up in host
memory. On a chunk that does not hold it, the manager restores it, first evicting the least
recently used cached variants on those GPUs until each has room (eviction is free: GPU state is
never written back). At most one action runs on a GPU at a time: a granted chunk is not free.

``inventory``/``fits`` are the counts view Alg. 1 (admission) and Alg. 4 (the DP) need: with sizes
that divide each other, a multiset of requests fits the free chunks iff, for every size ``s``, the
requests of size ``>= s`` need no more ``s``-slots than the free chunks of size ``>= s`` hold; the
allocator above (smallest fitting chunk first) realises any such multiset in any order.

State in, state out: the simulator and the live GPU manager keep one ``Pool`` value.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from treadle.errors import SpecError

SIZES = (1, 2, 4, 8)
NODE_GPUS = 8


@dataclasses.dataclass(frozen=True, order=True)
class Chunk:
    node: int
    start: int
    size: int

    def __post_init__(self) -> None:
        if self.size not in SIZES or self.start % self.size or not 0 <= self.start < NODE_GPUS:
            raise SpecError("a chunk is an aligned 1/2/4/8-GPU interval of a node", field="chunk", value=self)

    @property
    def end(self) -> int:
        return self.start + self.size

    def covers(self, other: Chunk) -> bool:
        return self.node == other.node and self.start <= other.start and other.end <= self.end

    def overlaps(self, other: Chunk) -> bool:
        return self.node == other.node and self.start < other.end and other.start < self.end

    def halves(self) -> tuple[Chunk, Chunk]:
        half = self.size // 2
        return Chunk(self.node, self.start, half), Chunk(self.node, self.start + half, half)

    def buddy(self) -> Chunk:
        return Chunk(self.node, self.start ^ self.size, self.size)

    def parent(self) -> Chunk:
        return Chunk(self.node, self.start & ~(2 * self.size - 1), 2 * self.size)


@dataclasses.dataclass(frozen=True)
class Cached:
    """A service variant resident in GPU memory on ``chunk``."""

    service: str
    chunk: Chunk
    gb_per_gpu: float
    last_used: int


@dataclasses.dataclass(frozen=True)
class Pool:
    nodes: int
    gpu_gb: float
    """GPU memory of one GPU."""
    free: frozenset[Chunk]
    cached: tuple[Cached, ...] = ()
    tick: int = 0
    """Logical time of the last grant (LRU order)."""


@dataclasses.dataclass(frozen=True)
class Placement:
    chunk: Chunk
    restore: bool
    """The variant was not resident on ``chunk``: it is restored from host memory first."""
    evicted: tuple[str, ...]
    """Variants evicted (LRU first) to make room."""


def empty(nodes: int, gpu_gb: float) -> Pool:
    if nodes < 1 or gpu_gb <= 0:
        raise SpecError("needs nodes >= 1 and gpu_gb > 0", field="gpus", value=(nodes, gpu_gb))
    return Pool(nodes, gpu_gb, frozenset(Chunk(n, 0, NODE_GPUS) for n in range(nodes)))


def of_gpus(gpus: int, gpu_gb: float) -> Pool:
    """A pool of ``gpus`` GPUs: whole nodes of 8, then a last node holding only its first ``gpus % 8``.

    The last node's GPUs are its aligned chunks (6 GPUs: ``[0, 4)`` and ``[4, 6)``); the GPUs it
    lacks are never free, so no chunk ever merges into them and no grant covers them.
    """
    if gpus < 1:
        raise SpecError("needs at least one GPU", field="gpus", value=gpus)
    whole, rest = divmod(gpus, NODE_GPUS)
    pool = empty(whole + (rest > 0), gpu_gb)
    if not rest:
        return pool
    free = set(pool.free) - {Chunk(whole, 0, NODE_GPUS)}
    start = 0
    for size in reversed(SIZES):
        if rest & size:
            free.add(Chunk(whole, start, size))
            start += size
    return dataclasses.replace(pool, free=frozenset(free))


def level(units: int) -> int:
    """The chunk size that serves ``units`` GPUs (``units`` must be one of ``SIZES``)."""
    if units not in SIZES:
        raise SpecError(f"GPU amounts are one of {SIZES}", field="units", value=units)
    return units


def allocate(pool: Pool, units: int, service: str, gb_per_gpu: float) -> tuple[Pool, Placement] | None:
    """A chunk of ``units`` GPUs for an action of ``service``; ``None`` if no free chunk is big enough."""
    size = level(units)
    if gb_per_gpu > pool.gpu_gb:
        raise SpecError("the variant never fits one GPU's memory", field="gb_per_gpu", value=gb_per_gpu)
    homes = [c.chunk for c in pool.cached if c.service == service and c.chunk.size == size]
    for b in SIZES[SIZES.index(size) :]:
        at_level = sorted(c for c in pool.free if c.size == b)
        if at_level:
            break
    else:
        return None
    # Cache affinity: a chunk of this level holding a free home of the variant, else the lowest.
    chosen, target = at_level[0], None
    for c in at_level:
        home = next((h for h in homes if c.covers(h)), None)
        if home is not None:
            chosen, target = c, home
            break
    free = set(pool.free)
    free.remove(chosen)
    while chosen.size > size:
        lo, hi = chosen.halves()
        chosen, spare = (hi, lo) if target is not None and hi.covers(target) else (lo, hi)
        free.add(spare)
    tick = pool.tick + 1
    cached, evicted, restore = _restore(pool, chosen, service, gb_per_gpu, tick)
    return (
        dataclasses.replace(pool, free=frozenset(free), cached=cached, tick=tick),
        Placement(chosen, restore, evicted),
    )


def _restore(
    pool: Pool, chunk: Chunk, service: str, gb_per_gpu: float, tick: int
) -> tuple[tuple[Cached, ...], tuple[str, ...], bool]:
    """The cache after serving ``service`` on ``chunk``: (cached, evicted variants, restored?)."""
    kept = list(pool.cached)
    for i, c in enumerate(kept):
        if c.service == service and c.chunk == chunk:
            kept[i] = dataclasses.replace(c, last_used=tick)
            return tuple(kept), (), False
    evicted: list[str] = []
    for victim in sorted((c for c in kept if c.chunk.overlaps(chunk)), key=lambda c: c.last_used):
        if _room(kept, chunk, pool.gpu_gb) >= gb_per_gpu:
            break
        kept.remove(victim)
        evicted.append(victim.service)
    return (*kept, Cached(service, chunk, gb_per_gpu, tick)), tuple(evicted), True


def _room(cached: Sequence[Cached], chunk: Chunk, gpu_gb: float) -> float:
    """The least free GPU memory over the GPUs of ``chunk``."""
    used = [0.0] * chunk.size
    for c in cached:
        if c.chunk.overlaps(chunk):
            for g in range(max(c.chunk.start, chunk.start), min(c.chunk.end, chunk.end)):
                used[g - chunk.start] += c.gb_per_gpu
    return gpu_gb - max(used)


def release(pool: Pool, chunk: Chunk) -> Pool:
    """Return a granted chunk; it merges with its buddy while the buddy is free."""
    if any(c.overlaps(chunk) for c in pool.free):
        raise SpecError("the chunk (or part of it) is already free", field="chunk", value=chunk)
    free = set(pool.free)
    while chunk.size < NODE_GPUS and chunk.buddy() in free:
        free.remove(chunk.buddy())
        chunk = chunk.parent()
    free.add(chunk)
    return dataclasses.replace(pool, free=frozenset(free))


def forget(pool: Pool, service: str, chunk: Chunk) -> Pool:
    """``service`` is not resident on ``chunk`` after all (its restore failed or was cancelled)."""
    return dataclasses.replace(
        pool, cached=tuple(c for c in pool.cached if (c.service, c.chunk) != (service, chunk))
    )


Inventory = tuple[int, int, int, int]
"""Counts of free (or requested) chunks of sizes 1, 2, 4, 8."""


def inventory(pool: Pool) -> Inventory:
    counts = [0, 0, 0, 0]
    for c in pool.free:
        counts[SIZES.index(c.size)] += 1
    return counts[0], counts[1], counts[2], counts[3]


def fits(free: Inventory, demand: Inventory) -> bool:
    """Whether requests of ``demand`` (counts per size) fit free chunks of ``free``; see the module doc."""
    slots = 0  # spare slots of the current size, carried down from larger chunks
    for i in (3, 2, 1, 0):
        slots = slots * (2 if i < 3 else 1) + free[i] - demand[i]
        if slots < 0:
            return False
    return True
