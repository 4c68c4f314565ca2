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
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import struct
from collections.abc import Sequence
from typing import Literal

from treadle import errors
from treadle.services.fakevllm import tokenizer

PRINTABLE = [ord(c) for c in "abcdefghijklmnopqrstuvwxyz     eeeeaaoottnnss.,<>/0123456789\n"]
PauseMode = Literal["abort", "wait", "keep"]


@dataclasses.dataclass
class Output:
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: Literal["stop", "length", "abort"]
    stop_reason: str | int | None
    text: str


@dataclasses.dataclass
class _Request:
    aborted: bool = False
    generated: int = 0


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
    ) -> None:
        self.step_s, self.max_num_seqs, self.max_model_len = step_s, max_num_seqs, max_model_len
        self.step_per_seq_s = step_per_seq_s
        self.eos_threshold = int(eos_probability * 2**32)
        self.kv_capacity_tokens = kv_capacity_tokens
        self.weight_version: str | None = None
        self.running: dict[int, _Request] = {}
        self.waiting = 0
        self.kv_tokens = 0
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.finished: dict[str, int] = {"stop": 0, "length": 0, "abort": 0}
        self._slots = asyncio.Semaphore(max_num_seqs)
        self._resumed = asyncio.Event()
        self._resumed.set()
        self.pause_mode: PauseMode | None = None
        self._step: asyncio.Future[None] | None = None
        self._ids = 0
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def paused(self) -> bool:
        return self.pause_mode is not None

    async def generate(
        self, prompt_ids: Sequence[int], *, max_tokens: int, stop: Sequence[str] = (), seed: int = 0
    ) -> Output:
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
        rid, req = self._ids, _Request()
        self.running[rid] = req
        self._idle.clear()
        self.prompt_tokens_total += len(prompt_ids)
        self.kv_tokens += len(prompt_ids)
        try:
            return await self._decode(req, list(prompt_ids), max_tokens, stop, seed)
        except asyncio.CancelledError:
            self.finished["abort"] += 1  # the client went away: vLLM counts it as aborted
            raise
        finally:
            self.kv_tokens -= len(prompt_ids) + req.generated
            del self.running[rid]
            self._slots.release()
            if not self.running:
                self._idle.set()

    async def _decode(
        self, req: _Request, prompt: list[int], max_tokens: int, stop: Sequence[str], seed: int
    ) -> Output:
        digest = hashlib.blake2b(struct.pack(f"<{len(prompt)}I", *prompt), digest_size=16)
        digest.update(f"{self.weight_version}|{seed}".encode())
        out: list[int] = []
        logprobs: list[float] = []
        text = ""
        while True:
            if req.aborted:
                return self._finish(Output(out, logprobs, "abort", None, text))
            if len(out) >= max_tokens:
                return self._finish(Output(out, logprobs, "length", None, text))
            await self._next_step()
            if self.pause_mode == "keep":
                await self._resumed.wait()  # frozen mid-sequence, continues after resume
                continue
            h = digest.copy()
            h.update(struct.pack("<I", len(out)))
            a, b = struct.unpack("<QQ", h.digest())
            token = (
                tokenizer.EOS
                if len(out) > 0 and (a & 0xFFFFFFFF) < self.eos_threshold
                else PRINTABLE[b % len(PRINTABLE)]
            )
            out.append(token)
            logprobs.append(-0.01 - (a >> 40) / float(1 << 24) * 5.0)
            req.generated += 1
            self.kv_tokens += 1
            self.generation_tokens_total += 1
            if token == tokenizer.EOS:
                return self._finish(Output(out, logprobs, "stop", None, text))
            text += tokenizer.token_str(token)
            for s in stop:
                if s and s in text:
                    return self._finish(Output(out, logprobs, "stop", s, text[: text.index(s)]))

    def _finish(self, output: Output) -> Output:
        self.finished[output.finish_reason] += 1
        return output

    async def _next_step(self) -> None:
        # One timer per engine step for the whole batch: the first request to ask schedules it.
        if self.step_s <= 0:
            return
        if self._step is None:
            self._step = asyncio.get_running_loop().create_future()
            step = self.step_s + self.step_per_seq_s * len(self.running)
            asyncio.get_running_loop().call_later(step, self._fire)
        await asyncio.shield(self._step)

    def _fire(self) -> None:
        step, self._step = self._step, None
        if step is not None and not step.done():
            step.set_result(None)

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

    def abort_all(self) -> int:
        for req in self.running.values():
            req.aborted = True
        return len(self.running)

    @property
    def kv_usage(self) -> float:
        return min(self.kv_tokens / self.kv_capacity_tokens, 1.0)
