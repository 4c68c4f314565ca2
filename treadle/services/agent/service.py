"""ADD/ABORT per trajectory over vLLM's chat API, version tagging and load reporting.

Called by ``http_app``. ADD is ``generate``: one engine request per (trajectory, turn); a retried
``generate`` for the same (trajectory, turn) joins the request in flight, another turn of a
trajectory that is still generating is a ``Conflict``. ABORT cancels the engine request by closing
its connection, which vLLM (and the simulated engine) treat as an abort; the waiting ``generate``
answers ``finish_reason="abort"`` with no tokens, and the scheduler re-issues the turn.

Policy versions: vLLM's chat API does not say which weights produced which token, so each token is
tagged with the version the engine reported as loaded (``/weight_info``, refreshed by the poller and
after every resume) when the request started. When the engine's version changes while a request
runs (a ``pause(keep)`` swap), its tokens keep the older version: the tag is never newer than the
truth, so a staleness check on it can only be conservative.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import re
import time
import uuid

import msgspec
import prometheus_client

from treadle import errors, metrics
from treadle.services.agent import protocol
from treadle.services.httputil import client as http

log = logging.getLogger(__name__)

DEFAULT_SWAP_LEASE_S = 900.0
"""How long a pause may wait for its resume: far above any weight load (a Mooncake pull of a 70B
checkpoint takes minutes), since a lease that ends mid-load would serve half-loaded weights."""
TRAILING_INT = re.compile(r"(\d+)$")
FINISH_REASONS: tuple[protocol.FinishReason, ...] = ("stop", "length", "abort")
_FINISH: dict[str | None, protocol.FinishReason] = {reason: reason for reason in FINISH_REASONS}


# vLLM's chat request and reply, only the fields the agent sends or reads. msgspec encodes and decodes
# (and type-checks) them in one pass, skipping the reply's other fields unparsed: json.loads of a
# 16-token reply plus the extraction cost ~50 us a turn, this ~8 (the agent's hot path).
class _Message(msgspec.Struct):
    role: str
    content: str


class _EngineRequest(msgspec.Struct, omit_defaults=True):
    """``omit_defaults``: no ``model`` before the first poll learnt it, no empty ``stop``."""

    messages: list[_Message]
    max_tokens: int
    temperature: float
    logprobs: bool
    return_token_ids: bool
    model: str | None = None
    stop: list[str] | None = None
    request_id: str | None = None
    """vLLM's request id, ``<trajectory>.t<turn>.<random>``: the engine's logs name the trajectory
    (random: a re-issued turn must not collide with its aborted predecessor still in the engine)."""


class _Logprob(msgspec.Struct):
    logprob: float


class _Logprobs(msgspec.Struct):
    content: list[_Logprob] | None = None


class _ReplyMessage(msgspec.Struct):
    content: str | None = None


class _Choice(msgspec.Struct):
    message: _ReplyMessage
    token_ids: list[int] | None = None
    logprobs: _Logprobs | None = None
    finish_reason: str | None = None


class _Reply(msgspec.Struct):
    choices: list[_Choice]
    prompt_token_ids: list[int] | None = None


_ENCODER = msgspec.json.Encoder()
_DECODER = msgspec.json.Decoder(_Reply)


def parse_version(label: str | None) -> int:
    """The policy version in a vLLM weight-version label: ``"7"`` or ``"step-7"`` -> 7, none -> 0."""
    if not label:
        return 0
    match = TRAILING_INT.search(label.strip())
    return int(match.group(1)) if match else 0


@dataclasses.dataclass
class _InFlight:
    turn: int
    task: asyncio.Task[protocol.GenerateResult]


class AgentService:
    def __init__(
        self,
        *,
        engine_url: str,
        worker_id: str,
        registry: prometheus_client.CollectorRegistry,
        engine_timeout_s: float = 600.0,
        max_connections: int = 4096,
        agent: str = "",
        swap_lease_s: float = DEFAULT_SWAP_LEASE_S,
    ) -> None:
        self.worker_id = worker_id
        self.agent = agent
        """Whose weights the engine serves ("": not told, so no swap is refused for it)."""
        self.swapping = False
        """A pause (the start of a swap) has not been resumed yet."""
        self.swap_lease_s = swap_lease_s
        self._swap_lease: asyncio.TimerHandle | None = None
        self._swap_id = ""
        """The swap under way, as ``pause`` named it to its caller ("": none)."""
        self._lease_resume: asyncio.Task[None] | None = None
        # vLLM closes idle keep-alive connections after 5 s (VLLM_HTTP_TIMEOUT_KEEP_ALIVE); drop ours first.
        self.engine = http.new_client(
            engine_url, timeout_s=engine_timeout_s, max_connections=max_connections, keepalive_s=3.0
        )
        self.model: str | None = None
        self.label: str | None = None
        """The engine's weight-version label at the last poll (``None``: not read yet)."""
        self.version = 0
        self.healthy = False
        self.orphaned = False
        """The engine was paused when this agent started: a swap its previous container ran is over
        without a resume (``reload.Reloader`` ends it)."""
        self.answered = asyncio.Event()
        """Set at the engine's first answered poll (its label is known from then on)."""
        self.engine_waiting = 0
        self.kv_cache_usage = 0.0
        self.inflight: dict[str, _InFlight] = {}
        requests = prometheus_client.Counter(
            metrics.AGENT_REQUESTS_TOTAL,
            "Generate calls by finish reason",
            ["finish_reason"],
            registry=registry,
        )
        # Children looked up once: labels() takes a lock and hashes per call, on every turn.
        self._requests = {reason: requests.labels(reason) for reason in FINISH_REASONS}
        self._leases_expired = prometheus_client.Counter(
            metrics.AGENT_SWAP_LEASES_EXPIRED_TOTAL,
            "Weight swaps whose caller did not resume within the lease; the agent resumed the engine",
            registry=registry,
        )
        self._inflight = prometheus_client.Gauge(
            metrics.AGENT_INFLIGHT, "Trajectories generating", registry=registry
        )
        self._aborts = prometheus_client.Counter(
            metrics.AGENT_ABORTS_TOTAL, "ABORTs that hit", registry=registry
        )
        self._tokens = prometheus_client.Counter(
            metrics.AGENT_GENERATED_TOKENS_TOTAL, "Output tokens recorded", registry=registry
        )
        buckets = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30, 120)
        self._engine_s = prometheus_client.Histogram(
            metrics.AGENT_ENGINE_SECONDS, "Engine request time", registry=registry, buckets=buckets
        )
        self._overhead_s = prometheus_client.Histogram(
            metrics.AGENT_OVERHEAD_SECONDS, "Agent time per generate outside the engine call",
            registry=registry, buckets=buckets,
        )  # fmt: skip

    async def start(self) -> None:
        await self.refresh()
        try:
            paused = await http.call(self.engine, "GET", "/is_paused")
        except errors.TreadleError as exc:  # down: an engine that starts again starts unpaused
            log.info("engine pause state unknown at start: %s", exc)
            return
        self.orphaned = isinstance(paused, dict) and paused.get("is_paused") is True
        if self.orphaned:
            log.warning("worker %s: engine paused with no swap under way (this agent restarted mid-swap)",
                        self.worker_id)  # fmt: skip

    async def aclose(self) -> None:
        self._end_lease()
        for item in list(self.inflight.values()):
            item.task.cancel()
        await self.engine.aclose()

    async def generate(self, req: protocol.GenerateRequest) -> protocol.GenerateResult:
        current = self.inflight.get(req.trajectory_id)
        if current is not None:
            if current.turn != req.turn:
                raise errors.Conflict(
                    f"trajectory {req.trajectory_id!r} is still generating turn {current.turn}; abort it"
                )
            return await asyncio.shield(current.task)
        task = asyncio.create_task(self._run(req))
        self.inflight[req.trajectory_id] = _InFlight(req.turn, task)
        self._inflight.inc()
        try:
            return await asyncio.shield(task)
        finally:
            if (
                self.inflight.get(req.trajectory_id, None) is not None
                and self.inflight[req.trajectory_id].task is task
            ):
                del self.inflight[req.trajectory_id]
                self._inflight.dec()

    def abort(self, trajectory_id: str) -> bool:
        item = self.inflight.get(trajectory_id)
        if item is None or item.task.done():
            return False
        item.task.cancel()
        self._aborts.inc()
        return True

    async def _run(self, req: protocol.GenerateRequest) -> protocol.GenerateResult:
        started = time.perf_counter()
        version = self.version
        body = _EngineRequest(
            messages=[_Message(m.role, m.content) for m in req.messages], max_tokens=req.max_tokens,
            temperature=req.temperature, logprobs=True, return_token_ids=True, model=self.model,
            stop=req.stop or None, request_id=f"{req.trajectory_id}.t{req.turn}.{uuid.uuid4().hex[:8]}",
        )  # fmt: skip
        engine_started = time.perf_counter()
        try:
            raw = await http.call_raw(
                self.engine, "POST", "/v1/chat/completions", content=_ENCODER.encode(body),
                connect_wait_s=http.RESTART_WAIT_S,
            )  # fmt: skip
        except asyncio.CancelledError:
            self._requests["abort"].inc()
            return self._aborted(req)
        except errors.SpecError as exc:
            raise errors.SpecError(f"engine refused the request: {exc}", field=exc.field) from exc
        engine_s = time.perf_counter() - engine_started
        result = self._result(req, raw, version, engine_s)
        self._requests[result.finish_reason].inc()
        self._tokens.inc(len(result.output_token_ids))
        self._engine_s.observe(engine_s)
        self._overhead_s.observe(time.perf_counter() - started - engine_s)
        return result

    def _aborted(self, req: protocol.GenerateRequest) -> protocol.GenerateResult:
        return protocol.GenerateResult(
            trajectory_id=req.trajectory_id, text="", prompt_token_ids=[], output_token_ids=[],
            output_logprobs=[], output_versions=[], finish_reason="abort",
        )  # fmt: skip

    def _result(
        self, req: protocol.GenerateRequest, raw: bytes, version: int, engine_s: float = 0.0
    ) -> protocol.GenerateResult:
        try:
            reply = _DECODER.decode(raw)
            choice = reply.choices[0]
        except (msgspec.ValidationError, msgspec.DecodeError, IndexError) as exc:
            raise errors.Unavailable(f"engine answered without token ids/logprobs: {exc}") from exc
        token_ids, prompt_ids = choice.token_ids, reply.prompt_token_ids
        if token_ids is None or prompt_ids is None:
            raise errors.Unavailable("engine answered without token ids (return_token_ids unsupported?)")
        logprobs = [item.logprob for item in choice.logprobs.content or ()] if choice.logprobs else []
        if len(logprobs) != len(token_ids):
            raise errors.Unavailable(f"engine gave {len(token_ids)} token ids but {len(logprobs)} logprobs")
        # The fields were type-checked by the decoder just now; model_construct skips a second pass.
        return protocol.GenerateResult.model_construct(
            trajectory_id=req.trajectory_id, text=choice.message.content or "", prompt_token_ids=prompt_ids,
            output_token_ids=token_ids, output_logprobs=logprobs, output_versions=[version] * len(token_ids),
            finish_reason=_FINISH.get(choice.finish_reason, "stop"), engine_seconds=engine_s,
        )  # fmt: skip

    async def pause(self, mode: str, *, expect_agent: str = "") -> str:
        """Start a swap. The trainer and placement's rebalancer both swap weights; one swap at a time,
        and none for a caller that read another agent than the engine now serves, so a worker moved
        between a caller's read and its swap never gets the wrong agent's weights (``Conflict``)."""
        if self.swapping:
            raise errors.Conflict(f"worker {self.worker_id!r}: another weight swap is under way")
        if expect_agent and self.agent and expect_agent != self.agent:
            raise errors.Conflict(
                f"worker {self.worker_id!r} serves agent {self.agent!r}, not {expect_agent!r}"
            )
        self.swapping = True
        try:
            await http.call(self.engine, "POST", f"/pause?mode={mode}")
        except BaseException:
            self.swapping = False
            raise
        self._swap_lease = asyncio.get_running_loop().call_later(self.swap_lease_s, self._lease_expired)
        self._swap_id = uuid.uuid4().hex
        return self._swap_id

    async def resume(self, *, agent: str = "", swap_id: str = "") -> None:
        """End a swap; ``agent`` is whose weights the engine serves now (a move's receiver).

        ``swap_id`` (what ``pause`` returned): resume only that swap. A caller whose swap the lease
        already ended must not end the next caller's, maybe in the middle of its weight load."""
        if swap_id and swap_id != self._swap_id:
            raise errors.Conflict(
                f"worker {self.worker_id!r}: swap {swap_id} is not under way (its lease ended, or it was "
                "resumed); nothing was resumed"
            )
        self._swap_id = ""
        self._end_lease()
        try:
            await http.call(self.engine, "POST", "/resume")
        finally:
            self.swapping = False
            if agent:
                self.agent = agent
        await self.refresh()

    def _end_lease(self) -> None:
        if self._swap_lease is not None:
            self._swap_lease.cancel()
            self._swap_lease = None

    def _lease_expired(self) -> None:
        # The caller that paused (a trainer, or placement mid-move) died or hung: serve again rather
        # than hold the worker paused, and refusing every later swap, for good.
        log.error(
            "worker %s: a weight swap was not resumed within %.0f s; resuming the engine on the weights "
            "it holds (agent %r)", self.worker_id, self.swap_lease_s, self.agent,
        )  # fmt: skip
        self._swap_lease = None
        self._leases_expired.inc()
        self._lease_resume = asyncio.create_task(self._resume_after_lease(), name=f"lease {self.worker_id}")

    async def _resume_after_lease(self) -> None:
        try:
            await self.resume()
        except errors.TreadleError as exc:  # the engine is down too; its pod restarts it unpaused
            log.error("worker %s: resume after the swap lease failed: %s", self.worker_id, exc)

    def load(self) -> protocol.WorkerLoad:
        return protocol.WorkerLoad(
            worker_id=self.worker_id, running=len(self.inflight), waiting=self.engine_waiting,
            kv_cache_usage=self.kv_cache_usage, policy_version=self.version, healthy=self.healthy,
            agent=self.agent,
        )  # fmt: skip

    async def refresh(self) -> None:
        """Poll the engine: model name, loaded weight version, waiting requests, KV usage, health."""
        try:
            if self.model is None:
                models = await http.call(self.engine, "GET", "/v1/models")
                self.model = str(models["data"][0]["id"])
            info = await http.call(self.engine, "GET", "/weight_info")
            label = info.get("weight_version") if isinstance(info, dict) else None
            self.label = None if label is None else str(label)
            self.version = parse_version(self.label)
            scraped = parse_metrics(await http.text(self.engine, "/metrics"))
            self.engine_waiting = int(scraped.get(metrics.VLLM_NUM_REQUESTS_WAITING, 0))
            self.kv_cache_usage = float(scraped.get(metrics.VLLM_KV_CACHE_USAGE_PERC, 0.0))
            self.healthy = True
            self.answered.set()
        except (errors.TreadleError, KeyError, IndexError, TypeError, ValueError) as exc:
            log.warning("engine poll failed: %s", exc)
            self.healthy = False

    async def poll_forever(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            with contextlib.suppress(Exception):
                await self.refresh()


def parse_metrics(text: str) -> dict[str, float]:
    """Sum of each metric's samples in Prometheus text format (labels ignored)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_part, _, value = line.rpartition(" ")
        name = name_part.split("{", 1)[0].strip()
        try:
            out[name] = out.get(name, 0.0) + float(value)
        except ValueError:
            continue
    return out
