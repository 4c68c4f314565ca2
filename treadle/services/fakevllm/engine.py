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


@dataclasses.dataclass(eq=False)
class _Request:
    prompt_len: int
    output: Output
    """The whole output, as if it ran to its end; an abort cuts it at ``generated``."""
    start_step: int
    done: asyncio.Future[Output]

    def generated(self, step: int) -> int:
        return min(step - self.start_step, len(self.output.token_ids))


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
        self.prompt_tokens_total = 0
        self._finished_tokens = 0
        self.finished: dict[str, int] = {"stop": 0, "length": 0, "abort": 0}
        self._slots = asyncio.Semaphore(max_num_seqs)
        self._resumed = asyncio.Event()
        self._resumed.set()
        self.pause_mode: PauseMode | None = None
        self.steps = 0
        """Engine steps run so far; a running request has one more token after each."""
        self._due: dict[int, list[_Request]] = {}
        self._timer: asyncio.TimerHandle | None = None
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
        rid = self._ids
        self.prompt_tokens_total += len(prompt_ids)
        out = self._output(list(prompt_ids), max_tokens, stop, seed)
        if self.step_s <= 0 or not out.token_ids:  # no simulated time: done at once
            self._finished_tokens += len(out.token_ids)
            self._release()
            return self._finish(out)
        req = _Request(len(prompt_ids), out, self.steps, asyncio.get_running_loop().create_future())
        self.running[rid] = req
        self._idle.clear()
        self._due.setdefault(self.steps + len(out.token_ids), []).append(req)
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
                due = self._due.get(req.start_step + len(out.token_ids), [])
                if req in due:
                    due.remove(req)
            del self.running[rid]
            self._release()

    def _release(self) -> None:
        self._slots.release()
        if not self.running:
            self._idle.set()

    def _output(self, prompt: list[int], max_tokens: int, stop: Sequence[str], seed: int) -> Output:
        digest = hashlib.blake2b(struct.pack(f"<{len(prompt)}I", *prompt), digest_size=16)
        digest.update(f"{self.weight_version}|{seed}".encode())
        out: list[int] = []
        logprobs: list[float] = []
        text = ""
        while len(out) < max_tokens:
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
        # One timer per engine step for the whole batch, running while any request is.
        if self._timer is None and self.pause_mode != "keep":
            step = self.step_s + self.step_per_seq_s * len(self.running)
            self._timer = asyncio.get_running_loop().call_later(step, self._fire)

    def _fire(self) -> None:
        self._timer = None
        if self.pause_mode == "keep":
            return  # frozen mid-sequence: no step runs until resume
        self.steps += 1
        for req in self._due.pop(self.steps, ()):
            self._finished_tokens += len(req.output.token_ids)
            req.done.set_result(req.output)
        if self.running:
            self._arm()

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
            self._due[req.start_step + len(req.output.token_ids)].remove(req)
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
