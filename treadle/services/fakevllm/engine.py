"""The simulated engine: continuous batching over a fake model, with vLLM's pause/resume/abort rules.

Tokens are a deterministic function of (prompt ids, position, weight version, seed): same request,
same output, and a new weight version visibly changes outputs and logprobs. Generation advances in
engine steps of ``step_s`` seconds shared by every running request (one timer, like a real batch),
plus ``step_per_seq_s`` per request running (0 by default: a step costs the same at any batch size;
set, a long request batched with many others decodes slower, the interference Heddle places by);
at most ``max_num_seqs`` run, the rest wait. ``pause(mode)`` follows vLLM: ``abort`` ends in-flight
requests with ``finish_reason="abort"``, ``wait`` lets them finish, ``keep`` freezes them until
``resume``; new requests wait while paused. Cancelling a ``generate`` call (client disconnect)
aborts the request. Called by ``http_app``.

A request's tokens are a function of its prompt, so they are computed when it starts and the request
is filed under the step at which its last token is due: a step then costs work only for the
requests that finish in it, not for every running one (waking 2,000 coroutines per step would make
this simulator, not the code under test, the CPU hog of a benchmark). Aborts, pauses and the
counters see the same token-by-token progress as before, derived from the step count.

Prefill and vLLM's automatic prefix caching, off by default (``prefill_s_per_token`` 0,
``prefix_cache_blocks`` 0): with a cache, a starting request looks up its prompt's full blocks of
``BLOCK_SIZE`` tokens (a block is named by the hash of every token up to its end, vLLM's chain) and
only the tokens after the longest cached prefix are prefilled (at least one, as vLLM recomputes the
last prompt token). With ``prefill_s_per_token`` > 0 those tokens are processed in engine steps, in
arrival order, at most ``max_num_batched_tokens`` per step less one per decoding request (vLLM's
chunked prefill): a step costs ``step_s + step_per_seq_s * running + prefill_s_per_token * (its
prefill tokens)``, so a long prefill spreads over several steps and slows every request on the
engine. A request's first token comes with the step that finishes its prefill; from then on it is
filed under the step its last token is due, as above. The prompt's blocks are cached when its
prefill ends, and the blocks of prompt + generated tokens when it finishes (the next turn of the
same conversation then hits); the least recently used blocks are evicted beyond the capacity.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import hashlib
import struct
from collections.abc import Callable, Sequence
from typing import Any, Literal

from treadle import errors
from treadle.services.fakevllm import tokenizer

PRINTABLE = [ord(c) for c in "abcdefghijklmnopqrstuvwxyz     eeeeaaoottnnss.,<>/0123456789\n"]
PauseMode = Literal["abort", "wait", "keep"]
BLOCK_SIZE = 16
"""Tokens per KV block (vLLM's default ``--block-size`` on GPUs); the prefix cache's unit."""


class PrefixCache:
    """vLLM's automatic prefix caching at block level: full blocks of ``BLOCK_SIZE`` tokens, each named
    by a hash of its parent block's name and its own tokens (so by every token up to its end), kept
    in LRU order up to ``capacity_blocks``. Blocks of one request are touched tail first, as vLLM
    frees them, so an eviction takes a conversation's tail before its head."""

    def __init__(self, capacity_blocks: int) -> None:
        self.capacity_blocks = capacity_blocks
        self._blocks: collections.OrderedDict[int, None] = collections.OrderedDict()
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, block_hash: int) -> bool:
        return block_hash in self._blocks

    @staticmethod
    def hashes(tokens: Sequence[int], parents: Sequence[int] = ()) -> list[int]:
        """Names of the full blocks of ``tokens``; ``parents`` are already known names of its first blocks."""
        out = list(parents)
        parent = out[-1] if out else 0
        for start in range(len(out) * BLOCK_SIZE, len(tokens) - BLOCK_SIZE + 1, BLOCK_SIZE):
            parent = hash((parent, tuple(tokens[start : start + BLOCK_SIZE])))
            out.append(parent)
        return out

    def cached_blocks(self, names: Sequence[int]) -> int:
        """How many of ``names`` lead the sequence in the cache (the hit); touches them."""
        n = 0
        while n < len(names) and names[n] in self._blocks:
            n += 1
        for name in reversed(names[:n]):
            self._blocks.move_to_end(name)
        return n

    def insert(self, names: Sequence[int]) -> None:
        for name in reversed(names):
            self._blocks[name] = None
            self._blocks.move_to_end(name)
        while len(self._blocks) > self.capacity_blocks:
            self._blocks.popitem(last=False)
            self.evictions += 1

    def clear(self) -> None:
        self._blocks.clear()


@dataclasses.dataclass
class Output:
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: Literal["stop", "length", "abort"]
    stop_reason: str | int | None
    text: str


@dataclasses.dataclass(eq=False)
class _Request:
    prompt_len: int
    output: Output
    """The whole output, as if it ran to its end; an abort cuts it at ``generated``."""
    start_step: int | None
    """The step after which it has one token per step; None while its prefill is in progress."""
    done: asyncio.Future[Output]
    prompt: list[int] = dataclasses.field(default_factory=list)
    blocks: list[int] = dataclasses.field(default_factory=list)
    """Names of the prompt's full blocks (with a prefix cache)."""
    prefill_left: int = 0
    """Prompt tokens still to prefill (with a prefill cost)."""

    def generated(self, step: int) -> int:
        if self.start_step is None:
            return 0
        return min(step - self.start_step, len(self.output.token_ids))

    @property
    def due(self) -> int:
        assert self.start_step is not None
        return self.start_step + len(self.output.token_ids)


class SimulatedEngine:
    def __init__(
        self,
        *,
        step_s: float = 0.0,
        step_per_seq_s: float = 0.0,
        max_num_seqs: int = 256,
        max_model_len: int = 4096,
        eos_probability: float = 0.02,
        kv_capacity_tokens: int = 262_144,
        prefill_s_per_token: float = 0.0,
        max_num_batched_tokens: int = 8192,
        prefix_cache_blocks: int = 0,
        call_later: Callable[[float, Callable[[], None]], Any] | None = None,
    ) -> None:
        self.step_s, self.max_num_seqs, self.max_model_len = step_s, max_num_seqs, max_model_len
        self.step_per_seq_s = step_per_seq_s
        self.prefill_s_per_token = prefill_s_per_token
        """Seconds a step takes longer per prompt token it prefills; 0: prefill is free and immediate."""
        self.max_num_batched_tokens = max_num_batched_tokens
        """Tokens one step processes at most (decode tokens + prefill chunks), vLLM's flag."""
        self.prefix_cache = PrefixCache(prefix_cache_blocks) if prefix_cache_blocks > 0 else None
        self.prefix_cache_queries = 0
        """Prompt tokens looked up in the prefix cache (vLLM's ``prefix_cache_queries``)."""
        self.prefix_cache_hits = 0
        """Of those, tokens found cached (vLLM's ``prefix_cache_hits``)."""
        self.prefill_tokens_computed = 0
        """Prompt tokens actually prefilled (queried - hit, as steps process them)."""
        self._call_later = call_later
        self._prefilling: collections.deque[_Request] = collections.deque()
        self._chunk: list[tuple[_Request, int]] = []
        """The prefill chunks the armed step processes: (request, tokens)."""
        self.last_step_s = 0.0
        self.eos_threshold = int(eos_probability * 2**32)
        self.kv_capacity_tokens = kv_capacity_tokens
        self.weight_version: str | None = None
        self.running: dict[int, _Request] = {}
        self.waiting = 0
        self.prompt_tokens_total = 0
        self._finished_tokens = 0
        self.finished: dict[str, int] = {"stop": 0, "length": 0, "abort": 0}
        self._slots = asyncio.Semaphore(max_num_seqs)
        self._resumed = asyncio.Event()
        self._resumed.set()
        self.pause_mode: PauseMode | None = None
        self.steps = 0
        """Engine steps run so far; a running request has one more token after each."""
        self.busy_steps = 0
        """Of those, the steps that ran a request (not the one that runs out after the last finished)."""
        self._due: dict[int, list[_Request]] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._ids = 0
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def paused(self) -> bool:
        return self.pause_mode is not None

    async def generate(
        self,
        prompt_ids: Sequence[int],
        *,
        max_tokens: int,
        stop: Sequence[str] = (),
        seed: int = 0,
        tokens: int | None = None,
    ) -> Output:
        """``tokens``: the output's length, set by the caller (``http_app``'s ``--tokens-for``): EOS is
        its last token, or it stops at ``max_tokens`` (``length``). ``None``: EOS by the hash."""
        if len(prompt_ids) + max_tokens > self.max_model_len:
            raise errors.SpecError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, you requested "
                f"{len(prompt_ids) + max_tokens} tokens ({len(prompt_ids)} in the messages, {max_tokens} in "
                "the completion). Please reduce the length of the messages or completion.",
                field="max_tokens",
            )
        self.waiting += 1
        try:
            while self.pause_mode is not None:
                await self._resumed.wait()
            await self._slots.acquire()
        finally:
            self.waiting -= 1
        self._ids += 1
        rid = self._ids
        self.prompt_tokens_total += len(prompt_ids)
        prompt = list(prompt_ids)
        out = self._output(prompt, max_tokens, stop, seed, tokens)
        blocks: list[int] = []
        cached = 0
        if self.prefix_cache is not None:
            blocks = PrefixCache.hashes(prompt)
            # vLLM computes at least the last prompt token: a hit covers full blocks before it
            cached = self.prefix_cache.cached_blocks(blocks[: (len(prompt) - 1) // BLOCK_SIZE]) * BLOCK_SIZE
            self.prefix_cache_queries += len(prompt)
            self.prefix_cache_hits += cached
        if self.step_s <= 0 or not out.token_ids:  # no simulated time: done at once
            self.prefill_tokens_computed += len(prompt) - cached
            self._finished_tokens += len(out.token_ids)
            self._cache(prompt, blocks, out.token_ids)
            self._release()
            return self._finish(out)
        req = _Request(len(prompt), out, self.steps, asyncio.get_running_loop().create_future())
        req.prompt, req.blocks = prompt, blocks
        self.running[rid] = req
        self._idle.clear()
        if self.prefill_s_per_token > 0:
            req.start_step, req.prefill_left = None, max(1, len(prompt) - cached)
            self._prefilling.append(req)
        else:
            self.prefill_tokens_computed += len(prompt) - cached
            self._cache(prompt, blocks, ())
            self._due.setdefault(req.due, []).append(req)
        self._arm()
        try:
            return self._finish(await req.done)
        except asyncio.CancelledError:
            self.finished["abort"] += 1  # the client went away: vLLM counts it as aborted
            raise
        finally:
            # Cancelled (the awaiting task's cancellation cancels ``req.done`` too): its tokens so
            # far were generated all the same, and it must leave ``_due`` or its step would try to
            # resolve a cancelled future and stop the engine's clock.
            if not req.done.done() or req.done.cancelled():
                self._finished_tokens += req.generated(self.steps)
                self._unschedule(req)
            n = req.generated(self.steps)
            self._cache(prompt, blocks, req.output.token_ids[:n] if req.start_step is not None else None)
            del self.running[rid]
            self._release()

    def _unschedule(self, req: _Request) -> None:
        if req.start_step is None:
            if req in self._prefilling:
                self._prefilling.remove(req)
            return
        due = self._due.get(req.due, [])
        if req in due:
            due.remove(req)

    def _cache(self, prompt: list[int], blocks: list[int], generated: Sequence[int] | None) -> None:
        """Cache the prompt's blocks and, given the tokens generated, those of prompt + generated.

        ``generated`` None: the prefill did not finish (an abort), nothing more is cached."""
        if self.prefix_cache is None or generated is None:
            return
        if generated:
            blocks = PrefixCache.hashes([*prompt, *generated], blocks)
        self.prefix_cache.insert(blocks)

    def _release(self) -> None:
        self._slots.release()
        if not self.running:
            self._idle.set()

    def _output(
        self, prompt: list[int], max_tokens: int, stop: Sequence[str], seed: int, tokens: int | None
    ) -> Output:
        digest = hashlib.blake2b(struct.pack(f"<{len(prompt)}I", *prompt), digest_size=16)
        digest.update(f"{self.weight_version}|{seed}".encode())
        out: list[int] = []
        logprobs: list[float] = []
        text = ""
        while len(out) < max_tokens:
            h = digest.copy()
            h.update(struct.pack("<I", len(out)))
            a, b = struct.unpack("<QQ", h.digest())
            eos = len(out) > 0 and (a & 0xFFFFFFFF) < self.eos_threshold
            if tokens is not None:
                eos = len(out) == tokens - 1
            token = tokenizer.EOS if eos else PRINTABLE[b % len(PRINTABLE)]
            out.append(token)
            logprobs.append(-0.01 - (a >> 40) / float(1 << 24) * 5.0)
            if token == tokenizer.EOS:
                return Output(out, logprobs, "stop", None, text)
            text += tokenizer.token_str(token)
            for s in stop:
                if s and s in text:
                    return Output(out, logprobs, "stop", s, text[: text.index(s)])
        return Output(out, logprobs, "length", None, text)

    def _finish(self, output: Output) -> Output:
        self.finished[output.finish_reason] += 1
        return output

    def _arm(self) -> None:
        # One timer per engine step for the whole batch, running while any request is. The step's
        # prefill chunks are chosen when it is armed, as vLLM schedules a step before running it.
        if self._timer is None and self.pause_mode != "keep":
            step = self.step_s + self.step_per_seq_s * len(self.running)
            self._chunk = []
            if self._prefilling:
                budget = self.max_num_batched_tokens - (len(self.running) - len(self._prefilling))
                for req in self._prefilling:
                    if budget <= 0:
                        break
                    take = min(req.prefill_left, budget)
                    self._chunk.append((req, take))
                    budget -= take
                    step += take * self.prefill_s_per_token
            self.last_step_s = step
            call_later = self._call_later or asyncio.get_running_loop().call_later
            self._timer = call_later(step, self._fire)

    def _fire(self) -> None:
        self._timer = None
        if self.pause_mode == "keep":
            return  # frozen mid-sequence: no step runs until resume
        self.steps += 1
        self.busy_steps += bool(self.running)
        for req, take in self._chunk:
            if req.done.done() or req.start_step is not None:
                continue  # aborted or cancelled since the step was armed
            req.prefill_left -= take
            self.prefill_tokens_computed += take
            if req.prefill_left <= 0:  # prefill done: this step also samples its first token
                self._prefilling.remove(req)
                req.start_step = self.steps - 1
                self._cache(req.prompt, req.blocks, ())
                self._due.setdefault(req.due, []).append(req)
        self._chunk = []
        for req in self._due.pop(self.steps, ()):
            self._finished_tokens += len(req.output.token_ids)
            req.done.set_result(req.output)
        if self.running:
            self._arm()

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block (vLLM's ``/reset_prefix_cache``, what RL frameworks call after a
        weight update: the old weights' KV is stale). True when there was a cache to reset."""
        if self.prefix_cache is None:
            return False
        self.prefix_cache.clear()
        return True

    async def pause(self, mode: PauseMode) -> None:
        self.pause_mode = mode
        self._resumed.clear()
        if mode == "abort":
            self.abort_all()
        elif mode == "wait":
            await self._idle.wait()

    def resume(self) -> None:
        self.pause_mode = None
        self._resumed.set()
        if self.running:
            self._arm()

    def abort_all(self) -> int:
        """End every running request now with ``finish_reason="abort"`` and the tokens it has so far."""
        for req in self.running.values():
            if req.done.done():
                continue
            n = req.generated(self.steps)
            ids = req.output.token_ids[:n]
            self._unschedule(req)
            self._finished_tokens += n
            text = "".join(map(tokenizer.token_str, ids))
            req.done.set_result(Output(ids, req.output.logprobs[:n], "abort", None, text))
        return len(self.running)

    @property
    def generation_tokens_total(self) -> int:
        """Tokens generated so far, finished requests' and running ones' (vLLM counts every step's)."""
        in_progress = sum(r.generated(self.steps) for r in self.running.values() if not r.done.done())
        return self._finished_tokens + in_progress

    @property
    def kv_tokens(self) -> int:
        return sum(r.prompt_len + r.generated(self.steps) for r in self.running.values())

    @property
    def kv_usage(self) -> float:
        return min(self.kv_tokens / self.kv_capacity_tokens, 1.0)
