"""The simulated engine's determinism and limits, its tokenizer, and the agent's parsers (pure)."""

from __future__ import annotations

import asyncio
import json

import prometheus_client
import pytest

from treadle import errors
from treadle.services.agent import protocol, service
from treadle.services.fakevllm import engine, tokenizer


def test_tokenizer_round_trip_and_chat_template() -> None:
    assert tokenizer.decode(tokenizer.encode("héllo <x>")) == "héllo <x>"
    ids = tokenizer.apply_chat_template([("user", "hi")])
    assert ids[0] == tokenizer.BOS and ids[1] == tokenizer.IM_START
    assert tokenizer.decode(ids) == "user\nhi\nassistant\n"


async def test_engine_is_deterministic_and_version_changes_output() -> None:
    eng = engine.SimulatedEngine(eos_probability=0.0)
    a = await eng.generate([1, 2, 3], max_tokens=32)
    b = await eng.generate([1, 2, 3], max_tokens=32)
    assert (a.token_ids, a.logprobs) == (b.token_ids, b.logprobs)
    assert a.finish_reason == "length" and len(a.token_ids) == 32
    assert all(-5.02 <= lp < 0 for lp in a.logprobs)
    eng.weight_version = "step-1"
    c = await eng.generate([1, 2, 3], max_tokens=32)
    assert c.token_ids != a.token_ids


async def test_engine_length_set_by_the_caller_ends_with_eos_or_at_max_tokens() -> None:
    eng = engine.SimulatedEngine(eos_probability=0.5)  # the hash alone would end most outputs early
    out = await eng.generate([1, 2, 3], max_tokens=32, tokens=20)
    assert (len(out.token_ids), out.token_ids[-1], out.finish_reason) == (20, tokenizer.EOS, "stop")
    assert tokenizer.EOS not in out.token_ids[:-1]
    capped = await eng.generate([1, 2, 3], max_tokens=8, tokens=20)
    assert (len(capped.token_ids), capped.finish_reason) == (8, "length")


async def test_engine_stop_string_and_eos() -> None:
    eng = engine.SimulatedEngine(eos_probability=0.0)
    full = await eng.generate([9], max_tokens=64)
    stop = full.text[10:12]
    cut = await eng.generate([9], max_tokens=64, stop=[stop])
    assert cut.finish_reason == "stop" and cut.stop_reason == stop and stop not in cut.text
    always_eos = engine.SimulatedEngine(eos_probability=1.0)
    out = await always_eos.generate([9], max_tokens=64)
    assert out.finish_reason == "stop" and out.token_ids[-1] == tokenizer.EOS and len(out.token_ids) == 2


async def test_engine_refuses_over_max_model_len_and_keeps_accounts() -> None:
    eng = engine.SimulatedEngine(max_model_len=16)
    with pytest.raises(errors.SpecError) as exc:
        await eng.generate(list(range(10)), max_tokens=7)
    assert exc.value.field == "max_tokens"
    assert (eng.waiting, len(eng.running), eng.kv_tokens) == (0, 0, 0)


@pytest.mark.parametrize(
    ("label", "version"),
    [(None, 0), ("", 0), ("7", 7), ("step-12", 12), ("v3 ", 3), ("latest", 0)],
    ids=["none", "empty", "int", "step-n", "space", "no-digits"],
)
def test_parse_version(label: str | None, version: int) -> None:
    assert service.parse_version(label) == version


def test_parse_metrics_sums_labelled_samples() -> None:
    text = (
        "# HELP vllm:num_requests_waiting x\n"
        'vllm:num_requests_waiting{engine="0",model_name="m"} 2.0\n'
        'vllm:num_requests_waiting{engine="1",model_name="m"} 3.0\n'
        'vllm:kv_cache_usage_perc{engine="0"} 0.25\n'
        "garbage line\n"
    )
    assert service.parse_metrics(text) == {"vllm:num_requests_waiting": 5.0, "vllm:kv_cache_usage_perc": 0.25}


async def test_engine_steps_finish_requests_with_per_token_accounts() -> None:
    eng = engine.SimulatedEngine(step_s=0.001, eos_probability=0.0)
    long = asyncio.create_task(eng.generate([1, 2], max_tokens=1000))
    short = await eng.generate([3], max_tokens=4)
    assert short.finish_reason == "length" and len(short.token_ids) == 4
    assert eng.generation_tokens_total >= 4 + 3 and eng.kv_tokens == 2 + eng.steps
    assert eng.abort_all() == 1
    cut = await long
    assert cut.finish_reason == "abort" and 4 <= len(cut.token_ids) < 1000
    assert len(cut.logprobs) == len(cut.token_ids) and len(cut.text) == len(cut.token_ids)
    assert (len(eng.running), eng.kv_tokens, eng.finished["abort"]) == (0, 0, 1)


async def test_engine_keeps_stepping_after_a_client_cancels_its_request() -> None:
    """A request cancelled by its client (the agent's ABORT) leaves the step schedule; the others finish."""
    eng = engine.SimulatedEngine(step_s=0.001, eos_probability=0.0)
    cancelled = asyncio.create_task(eng.generate([1], max_tokens=3))
    survivor = asyncio.create_task(eng.generate([2], max_tokens=8))
    await asyncio.sleep(0)  # both are running
    cancelled.cancel()
    out = await asyncio.wait_for(survivor, timeout=5)
    assert len(out.token_ids) == 8 and cancelled.cancelled()
    assert (len(eng.running), eng.finished["abort"]) == (0, 1)


def test_agent_refuses_an_engine_reply_without_token_ids() -> None:
    svc = service.AgentService(
        engine_url="http://127.0.0.1:1", worker_id="w", registry=prometheus_client.CollectorRegistry()
    )
    req = protocol.GenerateRequest(
        trajectory_id="t", turn=0, messages=[protocol.ChatMessage(role="user", content="x")], max_tokens=2
    )
    reply = {"choices": [{"message": {"content": "ab"}, "finish_reason": "length"}], "prompt_token_ids": [1]}
    with pytest.raises(errors.Unavailable, match="token ids"):
        svc._result(req, json.dumps(reply).encode(), 0)
    reply["choices"][0]["token_ids"] = "nope"  # type: ignore[index]
    with pytest.raises(errors.Unavailable, match="token ids"):
        svc._result(req, json.dumps(reply).encode(), 0)
    reply["choices"][0].update(  # type: ignore[index]
        token_ids=[5, 6], logprobs={"content": [{"logprob": -1, "token": "a"}, {"logprob": -0.5}]}
    )
    ok = svc._result(req, json.dumps(reply).encode(), 3, 0.25)
    assert (ok.output_token_ids, ok.output_logprobs, ok.output_versions) == ([5, 6], [-1.0, -0.5], [3, 3])
    assert (ok.text, ok.finish_reason, ok.engine_seconds) == ("ab", "length", 0.25)
