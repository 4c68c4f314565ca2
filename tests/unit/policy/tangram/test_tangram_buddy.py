"""The GPU buddy pool: aligned chunks only, freed buddies merge, cache affinity, LRU eviction."""

from __future__ import annotations

import random

import pytest

from treadle.errors import SpecError
from treadle.policy.tangram import buddy


@pytest.mark.parametrize("seed", range(30))
def test_random_grants_and_releases_stay_aligned_disjoint_and_merge_back(seed: int) -> None:
    rng = random.Random(seed)
    pool = buddy.empty(2, 80.0)
    held: list[buddy.Chunk] = []
    for _ in range(200):
        if held and (rng.random() < 0.45 or not pool.free):
            pool = buddy.release(pool, held.pop(rng.randrange(len(held))))
        else:
            size = rng.choice(buddy.SIZES)
            got = buddy.allocate(pool, size, rng.choice("abc"), 10.0)
            if got is None:  # refused only when no free chunk is big enough
                assert all(c.size < size for c in pool.free)
                continue
            pool, placement = got
            c = placement.chunk
            assert c.size == size and c.start % c.size == 0 and c.end <= buddy.NODE_GPUS
            held.append(c)
        cells = [(c.node, g) for c in [*pool.free, *held] for g in range(c.start, c.end)]
        assert len(cells) == len(set(cells)) == 16  # free and held partition the GPUs
        for c in pool.free:  # merged: no free chunk has a free buddy
            assert c.size == buddy.NODE_GPUS or c.buddy() not in pool.free
    for c in held:
        pool = buddy.release(pool, c)
    assert pool.free == buddy.empty(2, 80.0).free


def test_smallest_level_first_and_split_remainders() -> None:
    pool, p = buddy.allocate(buddy.empty(1, 80.0), 1, "a", 10.0) or pytest.fail("no chunk")
    assert p.chunk == buddy.Chunk(0, 0, 1)
    assert pool.free == {buddy.Chunk(0, 1, 1), buddy.Chunk(0, 2, 2), buddy.Chunk(0, 4, 4)}
    pool, p = buddy.allocate(pool, 2, "a", 10.0) or pytest.fail("no chunk")
    assert p.chunk == buddy.Chunk(0, 2, 2)  # the free 2-chunk, not a split of the 4


def test_cache_affinity_picks_the_chunk_that_holds_the_variant() -> None:
    pool = buddy.empty(2, 80.0)
    pool, a = buddy.allocate(pool, 8, "judge@tp8", 30.0) or pytest.fail("no chunk")
    pool, b = buddy.allocate(pool, 8, "teacher@tp8", 30.0) or pytest.fail("no chunk")
    pool = buddy.release(buddy.release(pool, a.chunk), b.chunk)
    pool, again = buddy.allocate(pool, 8, "teacher@tp8", 30.0) or pytest.fail("no chunk")
    assert again.chunk == b.chunk and not again.restore
    pool, judge = buddy.allocate(pool, 8, "judge@tp8", 30.0) or pytest.fail("no chunk")
    assert judge.chunk == a.chunk and not judge.restore


def test_a_forgotten_variant_is_restored_again_on_its_next_grant() -> None:
    pool = buddy.of_gpus(1, 80.0)
    pool, first = buddy.allocate(pool, 1, "judge@tp1", 30.0) or pytest.fail("no chunk")
    assert first.restore
    pool = buddy.forget(buddy.release(pool, first.chunk), "judge@tp1", first.chunk)
    pool, again = buddy.allocate(pool, 1, "judge@tp1", 30.0) or pytest.fail("no chunk")
    assert again.chunk == first.chunk and again.restore


def test_restore_evicts_least_recently_used_until_the_variant_fits() -> None:
    pool = buddy.empty(1, 80.0)
    for name in ("old", "mid", "new"):
        pool, p = buddy.allocate(pool, 8, name, 25.0) or pytest.fail("no chunk")
        pool = buddy.release(pool, p.chunk)
    pool, p = buddy.allocate(pool, 8, "big", 50.0) or pytest.fail("no chunk")
    assert p.restore and p.evicted == ("old", "mid")  # 75 GB used: two must go for 50 more
    assert {c.service for c in pool.cached} == {"new", "big"}


def test_bad_requests_are_refused_with_the_field() -> None:
    with pytest.raises(SpecError) as info:
        buddy.allocate(buddy.empty(1, 80.0), 3, "a", 1.0)
    assert info.value.field == "units"
    with pytest.raises(SpecError) as info:
        buddy.Chunk(0, 2, 4)
    assert info.value.field == "chunk"
    with pytest.raises(SpecError):
        buddy.release(buddy.empty(1, 80.0), buddy.Chunk(0, 0, 2))


@pytest.mark.parametrize(
    ("free", "demand", "fits"),
    [
        ((0, 0, 0, 1), (8, 0, 0, 0), True),  # one node, split all the way down
        ((0, 0, 0, 1), (1, 0, 0, 1), False),
        ((2, 1, 0, 0), (0, 2, 0, 0), False),  # two loose GPUs are no aligned pair
        ((0, 2, 1, 0), (0, 0, 2, 0), False),  # two 2-chunks of different nodes are no 4-chunk
        ((0, 1, 1, 0), (2, 1, 0, 0), True),
    ],
)
def test_fits_counts(free: buddy.Inventory, demand: buddy.Inventory, fits: bool) -> None:
    assert buddy.fits(free, demand) is fits


@pytest.mark.parametrize("gpus", [1, 2, 3, 5, 6, 7, 8, 11, 16])
def test_a_pool_of_any_gpu_count_grants_only_its_own_gpus_and_merges_back(gpus: int) -> None:
    pool = buddy.of_gpus(gpus, 80.0)
    assert sum(c.size for c in pool.free) == gpus
    granted = []
    while (got := buddy.allocate(pool, 1, "judge@tp1", 10.0)) is not None:
        pool, placement = got
        granted.append(placement.chunk)
    owned = {(n, g) for n in range(pool.nodes) for g in range(8) if n * 8 + g < gpus}
    assert {(c.node, c.start) for c in granted} == owned  # every GPU once, none beyond the count
    for chunk in granted:
        pool = buddy.release(pool, chunk)
    assert pool.free == buddy.of_gpus(gpus, 80.0).free  # freed buddies merged, never past the count
