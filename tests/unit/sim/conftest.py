"""A tiny scenario (4 workers, batch 16) that every simulator test can afford to run."""

from __future__ import annotations

import copy
from typing import Any

import pytest

WORKLOAD: dict[str, Any] = {
    "turns": {"dist": "lognormal", "mean": 3, "cv": 0.5, "min": 1, "max": 8, "source": "test"},
    "prompt_tokens": {"dist": "const", "mean": 300, "source": "test"},
    "observation_tokens": {"dist": "lognormal", "mean": 200, "cv": 0.5, "source": "test"},
    "response_tokens": {"dist": "lognormal", "mean": 400, "cv": 1.0, "max": 4000, "source": "test"},
    "tool_latency_s": {"dist": "lognormal", "mean": 0.5, "cv": 1.0, "source": "test"},
    "reset_s": {"dist": "lognormal", "mean": 1.0, "cv": 0.5, "source": "test"},
    "reset_failure_p": 0.05,
    "reset_failure_s": {"dist": "const", "mean": 30, "source": "test"},
}

TINY: dict[str, Any] = {
    "version": 1,
    "name": "tiny",
    "job": {
        "apiVersion": "treadle.dev/v1alpha1",
        "kind": "RolloutJob",
        "metadata": {"name": "tiny"},
        "spec": {
            "agents": [{"name": "policy", "model": "Qwen/Qwen3-8B"}],
            "pools": [
                {
                    "name": "h800",
                    "agent": "policy",
                    "accelerator": "H800",
                    "replicas": 2,
                    "preferredWork": "prefill-heavy",
                },
                {
                    "name": "h20",
                    "agent": "policy",
                    "accelerator": "H20",
                    "replicas": 2,
                    "preferredWork": "decode-heavy",
                },
            ],
            "tasks": [
                {
                    "name": "game",
                    "agents": ["policy"],
                    "environment": "frozenlake",
                    "reward": "rule",
                    "affinity": "prefill-heavy",
                    "groupSize": 4,
                },
                {
                    "name": "math",
                    "agents": ["policy"],
                    "environment": "math-tool",
                    "reward": "rule",
                    "affinity": "decode-heavy",
                    "groupSize": 4,
                    "redundancy": 0.5,
                },
            ],
            "environment": {"replicas": 32},
            "rollout": {"batchSize": 16, "staleness": 1},
        },
    },
    "simulation": {
        "seed": 3,
        "steps": 4,
        "systems": ["sync", "sync-plus", "verl-star", "round-robin", "one-off", "areal", "slime", "rollart"],
        "variants": {"rollart-local-reward": {"base": "rollart", "reward": "local"}},
        "max_in_flight": 32,
        "max_seqs": 8,
        "training": {"accelerator": "H800", "gpus": 8},
        "reward": {"gpus": 1},
        "workloads": {"game": WORKLOAD, "math": {**WORKLOAD, "reward": "llm-judge"}},
    },
}


@pytest.fixture
def tiny() -> dict[str, Any]:
    return copy.deepcopy(TINY)


@pytest.fixture
def workload() -> dict[str, Any]:
    return copy.deepcopy(WORKLOAD)
