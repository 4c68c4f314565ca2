"""The simulated engine's prefill cost and vLLM-style automatic prefix cache (pure: a fake clock).

The engine takes ``call_later``; these tests pass one that only records each step's duration and
fire the steps by hand, so every figure is exact and nothing sleeps.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from treadle.services.fakevllm import engine

STEP = 1.0
PER_TOKEN = 0.01


class Clock:
    """Steps the engine arms, fired by hand; ``now`` is the simulated time of the steps fired."""

    def __init__(self) -> None:
        self.armed: list[tuple[float, Callable[[], None]]] = []
        self.now = 0.0
        self.durations: list[float] = []

    def call_later(self, delay: float, callback: Callable[[], None]) -> Any:
        self.armed.append((delay, callback))
        return object()

    async def step(self) -> float:
        """Run the one armed step; returns its duration."""
        assert len(self.armed) == 1, self.armed
        delay, callback = self.armed.pop()
        self.now += delay
        self.durations.append(delay)
        callback()
        await _settle()
        return delay

    async def until(self, task: asyncio.Future[Any], bound: int = 1000) -> Any:
        for _ in range(bound):
            if task.done():
                return task.result()
            await self.step()
        raise AssertionError("not done")

    async def idle(self) -> None:
        """Run out the step the engine arms after its last request finished (it runs no request)."""
        while self.armed:
            _, callback = self.armed.pop()
            callback()
            await _settle()


async def _settle() -> None:
    for _ in range(5):  # let started and resolved requests run up to their next await
        await asyncio.sleep(0)


def make(clock: Clock, **kw: Any) -> engine.SimulatedEngine:
    args: dict[str, Any] = {
        "step_s": STEP, "prefill_s_per_token": PER_TOKEN, "max_num_batched_tokens": 1000,
        "prefix_cache_blocks": 1000, "eos_probability": 0.0, "call_later": clock.call_later,
    }  # fmt: skip
    return engine.SimulatedEngine(**(args | kw))


async def start(
    eng: engine.SimulatedEngine, prompt: list[int], max_tokens: int
) -> asyncio.Task[engine.Output]:
    task = asyncio.create_task(eng.generate(prompt, max_tokens=max_tokens))
    await _settle()
    return task


async def test_a_cold_engine_prefills_the_whole_prompt_then_decodes() -> None:
    clock = Clock()
    eng = make(clock)
    task = await start(eng, list(range(100)), 4)
    out = await clock.until(task)
    assert len(out.token_ids) == 4
    # the first step prefills all 100 tokens and samples the first token; three decode steps follow
    assert clock.durations == pytest.approx([STEP + 100 * PER_TOKEN, STEP, STEP, STEP])
    assert (eng.prefix_cache_queries, eng.prefix_cache_hits, eng.prefill_tokens_computed) == (100, 0, 100)


async def test_the_next_turn_on_the_same_engine_prefills_only_the_new_suffix() -> None:
    clock = Clock()
    eng = make(clock)
    first = list(range(100))
    out = await clock.until(await start(eng, first, 4))
    await clock.idle()
    # the next turn's prompt: this turn's prompt and output, then 20 new tokens (an observation)
    turn2 = [*first, *out.token_ids, *range(200, 220)]
    assert len(turn2) == 124
    clock.durations.clear()
    await clock.until(await start(eng, turn2, 2))
    # 104 tokens were cached as 6 full blocks of 16 (96 tokens); the other 28 are prefilled
    assert clock.durations == pytest.approx([STEP + 28 * PER_TOKEN, STEP])
    assert (eng.prefix_cache_queries, eng.prefix_cache_hits) == (100 + 124, 96)
    # the same prompt on another, cold engine prefills all of it
    cold_clock = Clock()
    cold = make(cold_clock)
    await cold_clock.until(await start(cold, turn2, 2))
    assert cold_clock.durations == pytest.approx([STEP + 124 * PER_TOKEN, STEP])
    assert cold.prefix_cache_hits == 0


async def test_a_repeated_prompt_still_computes_its_last_block() -> None:
    """vLLM recomputes at least the last prompt token, so a 32-token repeat hits one block of two."""
    clock = Clock()
    eng = make(clock)
    await clock.until(await start(eng, list(range(32)), 1))
    await clock.idle()
    clock.durations.clear()
    await clock.until(await start(eng, list(range(32)), 1))
    assert clock.durations == pytest.approx([STEP + 16 * PER_TOKEN])
    assert eng.prefix_cache_hits == 16


async def test_prefill_is_chunked_by_the_per_step_token_budget_less_decode_tokens() -> None:
    clock = Clock()
    eng = make(clock, max_num_batched_tokens=50)
    decoding = await start(eng, [7], 10)
    assert await clock.step() == pytest.approx(STEP + 1 * PER_TOKEN)  # its prefill and first token
    long = await start(eng, list(range(120)), 2)
    # it arrived while the next step was already scheduled (vLLM schedules a step before running it)
    assert await clock.step() == pytest.approx(STEP)
    # 50 tokens a step, one of them taken by the decoding request: 49 + 49 + 22
    assert await clock.step() == pytest.approx(STEP + 49 * PER_TOKEN)
    assert await clock.step() == pytest.approx(STEP + 49 * PER_TOKEN)
    assert not long.done() and eng.generation_tokens_total == 4  # only the decoding request's
    assert await clock.step() == pytest.approx(STEP + 22 * PER_TOKEN)  # last chunk + first token
    assert await clock.step() == pytest.approx(STEP)
    assert len((await clock.until(long)).token_ids) == 2
    await clock.until(decoding)
    assert eng.prefill_tokens_computed == 121


async def test_a_step_with_prefill_is_longer_for_every_running_request() -> None:
    async def time_to_finish(with_prefill: bool) -> float:
        clock = Clock()
        eng = make(clock)
        short = await start(eng, [7], 5)
        await clock.step()
        if with_prefill:
            await start(eng, list(range(1000, 1100)), 1)  # another request's 100-token prompt
        await clock.until(short)
        return clock.now

    alone, beside_a_prefill = await time_to_finish(False), await time_to_finish(True)
    assert alone == pytest.approx(STEP + PER_TOKEN + 4 * STEP)
    assert beside_a_prefill == pytest.approx(alone + 100 * PER_TOKEN)


async def test_the_least_recently_used_blocks_are_evicted() -> None:
    cache = engine.PrefixCache(capacity_blocks=3)
    a, b, c, d = (engine.PrefixCache.hashes([i] * engine.BLOCK_SIZE) for i in range(4))
    cache.insert(a + b)  # two one-block conversations
    cache.insert(c)
    assert cache.cached_blocks(a) == 1  # a touched: b is now the least recently used
    cache.insert(d)
    assert (a[0] in cache, b[0] in cache, c[0] in cache, d[0] in cache) == (True, False, True, True)
    assert cache.evictions == 1 and len(cache) == 3
    # a chain: a block is named by every token up to its end, so one changed token changes the rest
    chain = engine.PrefixCache.hashes(list(range(48)))
    assert engine.PrefixCache.hashes([99, *range(1, 48)])[1:] != chain[1:]
    assert engine.PrefixCache.hashes(list(range(48)), chain[:1]) == chain


async def test_an_engine_whose_cache_is_full_prefills_an_evicted_conversation_again() -> None:
    clock = Clock()
    eng = make(clock, prefix_cache_blocks=8)  # 128 tokens
    first = list(range(100))
    await clock.until(await start(eng, first, 1))  # caches 6 blocks
    await clock.idle()
    await clock.until(await start(eng, list(range(500, 600)), 1))  # 6 more: the first's are evicted
    await clock.idle()
    clock.durations.clear()
    await clock.until(await start(eng, first, 1))
    # vLLM frees a request's blocks tail first, so its head survives: 2 blocks of 6 hit
    assert clock.durations == pytest.approx([STEP + (100 - 32) * PER_TOKEN])
    assert eng.prefix_cache is not None and len(eng.prefix_cache) == 8
    assert eng.reset_prefix_cache() and len(eng.prefix_cache) == 0


async def test_a_request_cancelled_or_aborted_mid_prefill_leaves_the_queue() -> None:
    clock = Clock()
    eng = make(clock, max_num_batched_tokens=10)
    cancelled = await start(eng, list(range(100)), 3)
    survivor = await start(eng, list(range(200, 205)), 2)
    await clock.step()  # 10 tokens of the first prompt
    cancelled.cancel()
    await _settle()
    assert len((await clock.until(survivor)).token_ids) == 2
    # the step armed before the cancel keeps its cost; then only the survivor's 5 tokens are prefilled
    assert clock.durations == pytest.approx([STEP + 10 * PER_TOKEN] * 2 + [STEP + 5 * PER_TOKEN, STEP])
    aborted = await start(eng, list(range(300, 400)), 3)
    assert eng.abort_all() == 1
    await _settle()
    assert aborted.result().finish_reason == "abort" and aborted.result().token_ids == []
    assert (len(eng.running), eng.finished["abort"]) == (0, 2)


async def test_off_by_default_steps_cost_the_same_and_nothing_is_cached() -> None:
    clock = Clock()
    eng = engine.SimulatedEngine(step_s=STEP, eos_probability=0.0, call_later=clock.call_later)
    await clock.until(await start(eng, list(range(100)), 3))
    assert clock.durations == [STEP, STEP, STEP]
    assert eng.prefix_cache is None and (eng.prefix_cache_queries, eng.prefix_cache_hits) == (0, 0)
    # a cache without a prefill cost counts hits but times steps as before
    clock = Clock()
    eng = make(clock, prefill_s_per_token=0.0)
    out = await clock.until(await start(eng, list(range(100)), 3))
    await clock.idle()
    await clock.until(await start(eng, [*range(100), *out.token_ids, 5], 1))
    assert clock.durations == [STEP] * 4 and eng.prefix_cache_hits == 96


async def test_busy_steps_and_tokens_give_the_mean_batch() -> None:
    # vllm:iteration_tokens_total's count and sum: 3 + 5 tokens decoded together, 5 steps (3 at
    # batch 2, 2 at batch 1), not counting the step the engine runs out after the last one finished
    clock = Clock()
    eng = make(clock, prefill_s_per_token=0.0, prefix_cache_blocks=0)
    short = asyncio.create_task(eng.generate([1, 2, 3], max_tokens=3))
    long = asyncio.create_task(eng.generate([4, 5], max_tokens=5))
    await _settle()
    await clock.until(long)
    await clock.idle()
    assert short.done()
    assert (eng.steps, eng.busy_steps, eng.generation_tokens_total) == (6, 5, 8)
