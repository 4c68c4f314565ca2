"""The reward gateway, started as its own process from a job file, serves ``judge:<name>`` rewards on
its reward-model GPUs: SIMULATED engines (``python -m treadle.services.fakevllm``, one per resident
variant) behind REAL restores from host memory (the shard bytes are copied, and timed).

The job declares 2 GPUs of 0.07 GB and two models of 0.05 GB (0.06 GB per GPU at degree 1 with the
footprint factor), so a GPU holds one variant at a time and alternating models must evict."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx

from treadle import metrics
from treadle.api import v1alpha1
from treadle.services import podenv
from treadle.testing import procs, scraped

GB = 0.05


def job() -> v1alpha1.RolloutJob:
    return v1alpha1.parse_job({
        "apiVersion": v1alpha1.API_VERSION, "kind": v1alpha1.KIND, "metadata": {"name": "judged"},
        "spec": {
            "agents": [{"name": "a", "model": "m"}],
            "pools": [{"name": "p", "agent": "a", "accelerator": "H20"}],
            "tasks": [
                {"name": "one", "agents": ["a"], "environment": "math-tool", "reward": "judge:alpha"},
                {"name": "two", "agents": ["a"], "environment": "math-tool", "reward": "judge:beta"},
            ],
            "externalResources": {
                "rewardModelGpus": 2, "rewardModelGpuMemoryGb": 0.07,
                "rewardModels": [
                    {"name": "alpha", "model": "judge-a", "weightsGb": GB, "parallelism": [1, 2]},
                    {"name": "beta", "model": "judge-b", "weightsGb": GB},
                ],
            },
        },
    })  # fmt: skip


@contextlib.contextmanager
def gateway(tmp: Path) -> Iterator[str]:
    port = procs.free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [sys.executable, "-m", "treadle.services.reward", "--host", "127.0.0.1", "--port", str(port)]
    with procs.running("reward", argv, lambda: healthy(url), env=podenv.job_env(job(), tmp), timeout=60):
        yield url


def healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def grant(result: dict[str, object]) -> tuple[int, float]:
    """(GPUs granted, restore seconds) from a score's details."""
    details = result["details"]
    assert isinstance(details, dict)
    return int(details["gpus"]), float(details["restore_s"])


async def test_judge_rewards_run_on_the_gateways_gpus_with_measured_restores(tmp_path: Path) -> None:
    with gateway(tmp_path) as url:
        async with httpx.AsyncClient(base_url=url, timeout=60) as http:

            async def score(i: int) -> dict[str, object]:
                name = ("alpha", "beta")[i % 2]
                body = {"trajectory_id": f"t{i}", "reward_fn": f"judge:{name}", "response": "42",
                        "reference": "42", "prompt": "6 x 7?"}  # fmt: skip
                r = await http.post("/v1/score", json=body)
                assert r.status_code == 200, r.text
                result: dict[str, object] = r.json()
                return result

            async with asyncio.timeout(120):
                results = await asyncio.gather(*(score(i) for i in range(16)))
                # one model, one request after another: a variant still resident is reused (cache affinity)
                again = [await score(100 + 2 * i) for i in range(6)]
            text = (await http.get("/metrics")).text
    seen = [grant(r) for r in again]
    hits = [s for s in seen if s[1] == 0]
    for (before, _), (degree, restore_s) in itertools.pairwise(seen):
        assert degree != before or restore_s == 0, seen  # the same variant again: no restore
    assert hits, seen
    for r in results:
        assert 0.0 <= float(str(r["reward"])) <= 1.0 and grant(r)[0] in (1, 2)
    restores = scraped.by_label(scraped.parse(text), metrics.REWARD_MODEL_RESTORES_TOTAL, "model")
    evictions = scraped.by_label(scraped.parse(text), metrics.REWARD_MODEL_EVICTIONS_TOTAL, "model")
    restore_s = [g[1] for g in map(grant, results) if g[1] > 0]
    assert sum(restores.values()) == len(restore_s) + len(again) - len(hits)
    assert len(restore_s) >= 2  # both models were restored at least once
    assert sum(evictions.values()) >= 1  # one variant per GPU: alternating models evict
    shard_gb = [GB / g[0] for g in map(grant, results) if g[1] > 0]
    print(f"restores {restores} evictions {evictions}; restore seconds {sorted(restore_s)}; "
          f"shard GB {sorted(set(shard_gb))}")  # fmt: skip
