"""ARL-Tangram's reward-model GPUs with REAL vLLM on the dev cluster (``engine: vllm``).

``learn.yaml``'s rows in two tasks graded by two reward models (``judge:alpha``, ``judge:beta``,
both the job's tiny random Llama, whose verdicts are noise: what is shown is the serving) that share
the one SIMULATED GPU of the reward gateway's pod: the operator renders the gateway on the vLLM image
with a memory-backed ``/dev/shm``; the gateway in that pod starts a real vLLM engine per model on its
first grant, copies the checkpoint into host memory and, as the two models alternate, evicts one and
reloads the other's weights from that copy. Read from the gateway pod's own metrics: both models
restored more than once, scored requests for both, no failure but the 503s of an engine's first
start.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import test_learn as learn

from treadle import metrics
from treadle.devcluster import kwok
from treadle.operator import config
from treadle.testing import scraped

NAME = "learn-judged"
ENGINE_ENV = [{"name": "VLLM_CPU_KVCACHE_SPACE", "value": "1"}, {"name": "HF_HUB_OFFLINE", "value": "1"},
              {"name": "TRANSFORMERS_OFFLINE", "value": "1"}, {"name": "VLLM_NO_USAGE_STATS", "value": "1"},
              # the judge's prompt (question, reference, answer) outgrows the model's 512 positions;
              # a random model with rotary positions serves longer contexts alike
              {"name": "VLLM_ALLOW_LONG_MAX_MODEL_LEN", "value": "1"}]  # fmt: skip


def judged_variant() -> dict[str, Any]:
    job = learn.variant(NAME, learn.CONFIG_MAP, pools=1)
    (task,) = job["spec"]["tasks"]
    job["spec"]["tasks"] = [task | {"name": "alpha", "reward": "judge:alpha"},
                            task | {"name": "beta", "reward": "judge:beta"}]  # fmt: skip
    model = job["spec"]["agents"][0]["model"]
    judge = {"model": model, "weightsGb": 0.06, "engine": "vllm", "engineEnv": ENGINE_ENV,
             "engineArgs": ["--enforce-eager", "--max-model-len", "2048", "--max-num-seqs", "2"]}  # fmt: skip
    # One gateway pod: the job's one reward-model GPU is its; a second replica (demand) starts both
    # engines again beside it, which this 2-core machine pays for in minutes.
    job["spec"]["reward"] = job["spec"].get("reward", {}) | {"minReplicas": 1, "maxReplicas": 1}
    job["spec"]["externalResources"] = {  # one GPU holds one of the two (0.072 GB each with KV headroom)
        "rewardModelGpus": 1,
        "rewardModelGpuMemoryGb": 0.1,
        "rewardModels": [judge | {"name": "alpha"}, judge | {"name": "beta"}],
    }
    return job


def gateway_samples(c: kwok.DevCluster) -> scraped.Samples | None:
    """The reward gateway pod's metric samples; None until it is ready."""
    pods = learn.ready_pods(c, NAME, "reward")
    if not pods:
        return None
    try:
        text = httpx.get(
            f"http://{pods[0]['status']['podIP']}:{config.PORTS['metrics']}/metrics", timeout=5
        ).text
    except httpx.HTTPError:
        return None
    return scraped.parse(text)


@pytest.mark.timeout(1200)
def test_two_vllm_reward_models_share_a_gpu_of_the_gateways_pod(cluster: kwok.DevCluster) -> None:
    learn.apply(cluster, judged_variant())
    pod = learn.poll(
        lambda: learn.ready_pods(cluster, NAME, "reward") or None, "the gateway's pod ready", 300
    )[0]
    (container,) = pod["spec"]["containers"]
    assert container["image"].startswith("ghcr.io/treadle-dev/treadle-vllm"), container["image"]

    def restored_both() -> scraped.Samples | None:
        seen = gateway_samples(cluster)
        restores = metrics.REWARD_MODEL_RESTORES_TOTAL
        both = seen and all(scraped.value(seen, restores, model=m) >= 2 for m in ("alpha", "beta"))
        return seen if both else None

    seen = learn.poll(restored_both, "both reward models restored twice", 900)
    for m in ("alpha", "beta"):
        scored = scraped.value(seen, metrics.REWARD_REQUESTS_TOTAL, reward_fn=f"judge:{m}", outcome="scored")
        assert scored > 0, scraped.by_label(seen, metrics.REWARD_REQUESTS_TOTAL, "reward_fn")
        # one GPU: they take turns
        assert scraped.value(seen, metrics.REWARD_MODEL_EVICTIONS_TOTAL, model=m) >= 1, seen
    # Only "unavailable": an engine's first start, which the scheduler waits out (reward_unavailable_s).
    failures = scraped.by_label(seen, metrics.REWARD_FAILURES_TOTAL, "kind")
    assert {kind for kind, n in failures.items() if n} <= {"unavailable"}, failures
    restore = metrics.REWARD_MODEL_RESTORE_SECONDS
    for m in ("alpha", "beta"):
        n = scraped.value(seen, restore + "_count", model=m)
        print(f"{m}: {n:.0f} restores, mean {scraped.value(seen, restore + '_sum', model=m) / n:.3f} s")
    learn.delete(cluster, NAME)
