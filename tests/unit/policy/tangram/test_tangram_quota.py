"""API quotas as resource types: the enforced window, what an action asks, and quotas that can never
be met (errors naming the field)."""

from __future__ import annotations

import pytest

from treadle import errors
from treadle.api import jobconfig, v1alpha1
from treadle.policy.tangram import quota
from treadle.testing import fake_api


@pytest.mark.parametrize(
    ("rpm", "requests", "window_s"),
    [
        (600, 100, 10.0),  # the SWE example: 100 per sliding 10 s
        (30, 5, 10.0),
        (60, 10, 10.0),
        (10, 2, 12.0),  # 5 divides 10, 6 does not
        (7, 7, 60.0),  # a prime keeps the minute
        (1, 1, 60.0),
        (8, 2, 15.0),
    ],
)
def test_the_minute_is_enforced_as_k_shorter_windows(rpm: int, requests: int, window_s: float) -> None:
    q = quota.limit(0, "t", requests_per_minute=rpm, max_concurrent=4)
    assert (q.requests, q.window_s) == (requests, window_s)
    # k windows tile any minute: never more than the quota in 60 s
    assert q.requests * round(quota.MINUTE_S / q.window_s) == rpm


def test_demand_counts_calls_and_ignores_tools_without_a_quota() -> None:
    limits = quota.limits([("web-search", 600, 4), ("pdf", 60, 1)])
    assert quota.demand(["web-search", "calculator", "web-search"], limits) == {"web-search": 2}
    assert quota.demand([], limits) == {}


@pytest.mark.parametrize(
    ("tools", "field"),
    [
        (["pdf", "pdf"], "spec.externalResources.apiQuotas[1].maxConcurrent"),
        (["web-search"] * 3, "spec.externalResources.apiQuotas[0].requestsPerMinute"),
    ],
    ids=["more-at-once-than-maxConcurrent", "more-at-once-than-a-window"],
)
def test_an_action_no_quota_can_admit_names_the_field(tools: list[str], field: str) -> None:
    limits = quota.limits([("web-search", 2, 8), ("pdf", 60, 1)])  # web-search: 2 per minute
    with pytest.raises(errors.SpecError) as info:
        quota.demand(tools, limits)
    assert info.value.field == field and "never" in str(info.value)


def test_zero_concurrency_and_a_tool_twice_are_refused() -> None:
    with pytest.raises(errors.SpecError) as info:
        quota.limit(2, "t", requests_per_minute=10, max_concurrent=0)
    assert info.value.field == "spec.externalResources.apiQuotas[2].maxConcurrent"
    with pytest.raises(errors.SpecError) as info:
        quota.limits([("t", 10, 1), ("u", 10, 1), ("t", 5, 1)])
    assert info.value.field == "spec.externalResources.apiQuotas[2].tool"


def test_the_job_file_carries_the_quotas_to_the_env_pods() -> None:
    spec = {
        "agents": [{"name": "a", "model": "m"}],
        "pools": [{"name": "p", "agent": "a", "accelerator": "H100"}],
        "tasks": [{"name": "t", "agents": ["a"], "environment": "python-code", "reward": "code-tests"}],
        "externalResources": {
            "apiQuotas": [{"tool": "web-search", "requestsPerMinute": 600, "maxConcurrent": 32}]
        },
    }
    job = v1alpha1.RolloutJob(metadata={"name": "j"}, spec=v1alpha1.parse_spec(spec))
    env = jobconfig.job_config(job, max_tokens=8, max_in_flight=8, max_concurrent_generations=8).env
    assert env.api_quotas == {"web-search": quota.Limit(0, "web-search", 32, 100, 10.0)}


@pytest.mark.parametrize(
    ("times", "window", "most"),
    [([], 1.0, 0), ([0.0, 0.5, 0.99, 1.0], 1.0, 3), ([0.0, 1.0, 2.0], 1.0, 1), ([5.0, 5.0, 5.0], 0.1, 3)],
)
def test_most_in_a_sliding_window(times: list[float], window: float, most: int) -> None:
    assert fake_api.most_in_window(times, window) == most
