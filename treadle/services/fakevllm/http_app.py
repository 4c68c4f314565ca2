"""vLLM 0.32's HTTP surface over the simulated engine: the OpenAI routes the agent uses, the dev
routes for pause/resume/abort/weight version, and ``/metrics`` with vLLM's own metric names.

The simulated engine has no weights: its weight-update routes (``/init_weight_transfer_engine``,
``/start_weight_update``, ``/update_weights``, ``/finish_weight_update``) answer as vLLM 0.32 does when
started without ``--weight-transfer-config``, 500 with vLLM's error body; a swap of it only moves the
version label (``treadle.services.agent.client``, ``apply_version=None``).

Shapes follow what vLLM 0.32 returns (anchors/weights_inference_deps.md B4): ``token_ids`` per
choice and ``prompt_token_ids`` when ``return_token_ids`` is set, ``stop_reason``, chat logprobs
with ``bytes``, completions logprobs as ``tokens/token_logprobs/text_offset/top_logprobs``. A client
disconnect aborts the request, as vLLM's ``with_cancellation`` does. Non-streaming only.

``tokens_for`` (``--tokens-for REGEX=N``, tests only): a chat request whose ``request_id`` (vLLM's
body field; the agent sends ``<trajectory>.t<turn>.<random>``) matches ``REGEX`` from its start
generates exactly ``N`` tokens (at most ``max_tokens``), so a test sets each candidate's length.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Literal, TypeVar

import fastapi
import msgspec
import prometheus_client
import prometheus_client.registry
from fastapi import responses
from prometheus_client import core as prom_core
from pydantic import BaseModel, Field

from treadle import errors, metrics
from treadle.services.fakevllm import engine as engine_mod
from treadle.services.fakevllm import tokenizer
from treadle.services.httputil import app as http_app

MODEL = "simulated-llm"
FINGERPRINT = "vllm-0.32.0-simulated"
T = TypeVar("T")


class _Sampling(BaseModel):
    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0)
    stop: str | list[str] | None = None
    n: int = Field(default=1, ge=1)
    seed: int | None = None
    stream: bool = False
    return_token_ids: bool = False


class ChatMessage(BaseModel):
    role: str
    content: str | None = None


class ChatRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    request_id: str | None = None
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)


class CompletionRequest(_Sampling):
    prompt: str | list[int]
    logprobs: int | None = Field(default=None, ge=0, le=20)
    echo: bool = False


class WeightVersion(BaseModel):
    new_version: str


class AbortRequests(BaseModel):
    request_ids: list[str] | None = None


def build_app(
    *,
    engine: engine_mod.SimulatedEngine | None = None,
    registry: prometheus_client.CollectorRegistry | None = None,
    tokens_for: Sequence[tuple[str, int]] = (),
) -> fastapi.FastAPI:
    eng = engine or engine_mod.SimulatedEngine()
    lengths = [(re.compile(pattern), n) for pattern, n in tokens_for]

    def fixed_length(request_id: str | None) -> int | None:
        return next((n for pattern, n in lengths if request_id and pattern.match(request_id)), None)

    registry = registry or http_app.registry()
    registry.register(_EngineCollector(eng))
    app = http_app.new_app(title="vLLM (simulated by Treadle)", registry=registry)
    app.state.engine = eng

    @app.get("/health")
    async def health() -> responses.Response:
        return responses.Response(status_code=200)

    @app.get("/version")
    async def version() -> dict[str, str]:
        return {"version": "0.32.0"}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        card = {
            "id": MODEL, "object": "model", "created": int(time.time()), "owned_by": "vllm", "root": MODEL,
            "parent": None, "max_model_len": eng.max_model_len,
            "permission": [{
                "id": f"modelperm-{uuid.uuid4().hex}", "object": "model_permission",
                "created": int(time.time()),
                "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
                "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False,
                "organization": "*", "group": None, "is_blocking": False,
            }],
        }  # fmt: skip
        return {"object": "list", "data": [card]}

    @app.post("/v1/chat/completions")
    async def chat(req: ChatRequest, request: fastapi.Request) -> responses.Response:
        _check(req)
        prompt = tokenizer.apply_chat_template([(m.role, m.content or "") for m in req.messages])
        max_tokens = req.max_completion_tokens or req.max_tokens or eng.max_model_len - len(prompt)
        out = await _until_disconnect(
            request,
            eng.generate(
                prompt, max_tokens=max(max_tokens, 1), stop=_stops(req), seed=req.seed or 0,
                tokens=fixed_length(req.request_id),
            ),
        )  # fmt: skip
        logprobs = None
        if req.logprobs:
            logprobs = {
                "content": [_chat_logprob(t, lp) for t, lp in zip(out.token_ids, out.logprobs, strict=True)]
            }
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": out.text, "refusal": None, "annotations": None,
                        "audio": None, "function_call": None, "reasoning": None},
            "logprobs": logprobs, "finish_reason": out.finish_reason, "stop_reason": out.stop_reason,
            "token_ids": out.token_ids if req.return_token_ids else None, "routed_experts": None,
        }  # fmt: skip
        body = {
            "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
            "model": MODEL, "choices": [choice], "service_tier": None, "system_fingerprint": FINGERPRINT,
            "usage": _usage(len(prompt), len(out.token_ids)), "prompt_logprobs": None,
            "prompt_token_ids": prompt if req.return_token_ids else None, "prompt_text": None,
            "kv_transfer_params": None, "ec_transfer_params": None, "metrics": None,
        }  # fmt: skip
        return _json(body)

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, request: fastapi.Request) -> responses.Response:
        _check(req)
        prompt = (
            list(req.prompt)
            if isinstance(req.prompt, list)
            else [tokenizer.BOS, *tokenizer.encode(req.prompt)]
        )
        if any(not 0 <= t < tokenizer.VOCAB_SIZE for t in prompt):
            raise errors.SpecError(f"token ids must be in [0, {tokenizer.VOCAB_SIZE})", field="prompt")
        max_tokens = req.max_tokens or 16
        out = await _until_disconnect(
            request, eng.generate(prompt, max_tokens=max_tokens, stop=_stops(req), seed=req.seed or 0)
        )
        logprobs = None
        if req.logprobs is not None:
            tokens = [tokenizer.token_str(t) for t in out.token_ids]
            offsets, pos = [], 0
            for tok in tokens:
                offsets.append(pos)
                pos += len(tok)
            logprobs = {
                "text_offset": offsets, "token_logprobs": out.logprobs, "tokens": tokens,
                "top_logprobs": [{tok: lp} for tok, lp in zip(tokens, out.logprobs, strict=True)],
            }  # fmt: skip
        choice = {
            "index": 0, "text": out.text, "logprobs": logprobs, "finish_reason": out.finish_reason,
            "stop_reason": out.stop_reason, "token_ids": out.token_ids if req.return_token_ids else None,
            "prompt_logprobs": None, "prompt_token_ids": prompt if req.return_token_ids else None,
            "routed_experts": None,
        }  # fmt: skip
        body = {
            "id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
            "model": MODEL, "choices": [choice], "service_tier": None, "system_fingerprint": FINGERPRINT,
            "usage": _usage(len(prompt), len(out.token_ids)), "kv_transfer_params": None,
            "ec_transfer_params": None, "metrics": None,
        }  # fmt: skip
        return _json(body)

    @app.post("/pause")
    async def pause(
        mode: Literal["abort", "wait", "keep"] = "abort", clear_cache: bool = True
    ) -> dict[str, str]:
        await eng.pause(mode)
        if clear_cache:
            eng.reset_prefix_cache()
        return {"status": "paused"}

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache() -> responses.Response:
        eng.reset_prefix_cache()
        return responses.Response(status_code=200)

    @app.post("/resume")
    async def resume() -> dict[str, str]:
        eng.resume()
        return {"status": "resumed"}

    @app.get("/is_paused")
    async def is_paused() -> dict[str, bool]:
        return {"is_paused": eng.paused}

    @app.post("/abort_requests")
    async def abort_requests(req: AbortRequests) -> dict[str, Any]:
        # Requests are aborted by client disconnect here; ids are not tracked, so all are aborted.
        return {"status": "aborted", "aborted": eng.abort_all()}

    @app.post("/update_weight_version")
    async def update_weight_version(req: WeightVersion) -> dict[str, Any]:
        eng.weight_version = req.new_version
        return {"success": True, "new_version": req.new_version}

    for method in _WEIGHT_UPDATE_ROUTES:
        app.add_api_route(f"/{method}", _no_weight_transfer(method), methods=["POST"])

    @app.get("/weight_info")
    async def weight_info() -> dict[str, str | None]:
        return {"weight_version": eng.weight_version}

    @app.post("/tokenize")
    async def tokenize(body: dict[str, Any]) -> dict[str, Any]:
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            raise errors.SpecError("must be a string", field="prompt")
        ids = tokenizer.encode(prompt)
        return {"count": len(ids), "max_model_len": eng.max_model_len, "tokens": ids, "token_strs": None}

    return app


_WEIGHT_UPDATE_ROUTES = (
    "init_weight_transfer_engine", "start_weight_update", "update_weights", "finish_weight_update",
)  # fmt: skip


def _no_weight_transfer(method: str) -> Callable[[], Awaitable[responses.Response]]:
    """vLLM's answer to a weight-update route when no weight-transfer engine was configured."""
    message = (
        f"Call to {method} method failed: Weight transfer not configured. "
        "Please set weight_transfer_config to enable weight transfer."
    )
    body = {"error": {"message": message, "type": "InternalServerError", "param": None, "code": 500}}

    async def route() -> responses.Response:
        return responses.JSONResponse(body, status_code=500)

    return route


def _json(body: dict[str, Any]) -> responses.Response:
    # msgspec encodes a 16-token reply in ~5 us, json.dumps (JSONResponse) in ~60: the simulator's CPU
    # is taken from the processes a benchmark measures on the same cores.
    return responses.Response(msgspec.json.encode(body), media_type="application/json")


def _check(req: _Sampling) -> None:
    if req.model is not None and req.model != MODEL:
        raise errors.NotFound(f"The model `{req.model}` does not exist. Valid aliases: {MODEL}.")
    if req.n != 1:
        raise errors.SpecError("the simulated engine supports n=1 only", field="n")
    if req.stream:
        raise errors.SpecError("the simulated engine does not stream", field="stream")


def _stops(req: _Sampling) -> list[str]:
    return [req.stop] if isinstance(req.stop, str) else list(req.stop or [])


def _usage(prompt: int, completion: int) -> dict[str, Any]:
    return {"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion,
            "prompt_tokens_details": None, "completion_tokens_details": None}  # fmt: skip


def _chat_logprob(token_id: int, logprob: float) -> dict[str, Any]:
    tok = tokenizer.token_str(token_id)
    raw = list(tok.encode("utf-8")) if token_id >= 256 else [token_id]
    return {"token": tok, "logprob": logprob, "bytes": raw, "top_logprobs": []}


async def _until_disconnect(request: fastapi.Request, work: Awaitable[T]) -> T:
    """Run ``work`` but cancel it (aborting the engine request) if the client goes away first."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request.receive))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if task not in done:
            task.cancel()
            raise errors.Unavailable("client disconnected; request aborted")
        return task.result()
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher


async def _disconnected(receive: Callable[[], Awaitable[Any]]) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


class _EngineCollector(prometheus_client.registry.Collector):
    """vLLM's metric names, read from the engine at scrape time."""

    def __init__(self, eng: engine_mod.SimulatedEngine) -> None:
        self.eng = eng

    def collect(self) -> Any:
        labels = {"model_name": MODEL, "engine": "0"}

        def gauge(name: str, doc: str, value: float) -> prom_core.GaugeMetricFamily:
            g = prom_core.GaugeMetricFamily(name, doc, labels=list(labels))
            g.add_metric(list(labels.values()), value)
            return g

        def counter(name: str, doc: str, value: float) -> prom_core.CounterMetricFamily:
            c = prom_core.CounterMetricFamily(name, doc, labels=list(labels))
            c.add_metric(list(labels.values()), value)
            return c

        yield gauge(metrics.VLLM_NUM_REQUESTS_RUNNING, "Running requests (simulated)", len(self.eng.running))
        yield gauge(metrics.VLLM_NUM_REQUESTS_WAITING, "Waiting requests (simulated)", self.eng.waiting)
        yield gauge(
            metrics.VLLM_KV_CACHE_USAGE_PERC, "KV-cache usage, 1 = full (simulated)", self.eng.kv_usage
        )
        yield counter(metrics.VLLM_PROMPT_TOKENS, "Prefill tokens (simulated)", self.eng.prompt_tokens_total)
        yield counter(
            metrics.VLLM_GENERATION_TOKENS, "Generated tokens (simulated)", self.eng.generation_tokens_total
        )
        yield counter(
            metrics.VLLM_PREFIX_CACHE_QUERIES,
            "Prompt tokens looked up in the prefix cache (simulated)",
            self.eng.prefix_cache_queries,
        )
        yield counter(
            metrics.VLLM_PREFIX_CACHE_HITS, "Prompt tokens found in the prefix cache (simulated)",
            self.eng.prefix_cache_hits,
        )  # fmt: skip
        steps = prom_core.HistogramMetricFamily(
            metrics.VLLM_ITERATION_TOKENS,
            "Tokens per engine step (simulated; one +Inf bucket)",
            labels=list(labels),
        )
        # vLLM observes computed prompt tokens + generated tokens per step, so the sum is theirs
        tokens = self.eng.generation_tokens_total + self.eng.prefill_tokens_computed
        steps.add_metric(list(labels.values()), [("+Inf", self.eng.busy_steps)], tokens)
        yield steps
        success = prom_core.CounterMetricFamily(
            metrics.VLLM_REQUEST_SUCCESS, "Finished requests (simulated)", labels=[*labels, "finished_reason"]
        )
        for reason, count in self.eng.finished.items():
            success.add_metric([*labels.values(), reason], count)
        yield success
