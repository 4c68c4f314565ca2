"""The env pod's two resource settings (warm pool, CPUs per action)."""

from __future__ import annotations

import pytest

from treadle import errors
from treadle.api import jobconfig, v1alpha1
from treadle.sandbox import cores
from treadle.services.env import __main__ as env_main


@pytest.mark.parametrize(
    ("raw", "cpus"),
    [
        ("1", 1),
        ("2", 2),
        ("500m", 1),
        ("1500m", 2),
        ("2000m", 2),
        ("0.25", 1),
        ("1.5", 2),
        ("3e0", 3),
        ("1k", 1000),
    ],
)
def test_cpu_quantity_rounds_up_to_whole_cpus(raw: str, cpus: int) -> None:
    assert cores.cpus_per_action(raw) == cpus


@pytest.mark.parametrize("raw", ["", "abc", "-1", "1 core", "0", "0m", "1x"])
def test_bad_cpu_quantity_names_the_field(raw: str) -> None:
    with pytest.raises(errors.SpecError) as info:
        cores.cpus_per_action(raw)
    assert info.value.field == "spec.externalResources.cpuCoresPerAction"


SPEC = {
    "agents": [{"name": "a", "model": "m"}],
    "pools": [{"name": "p", "agent": "a", "accelerator": "H100"}],
    "tasks": [{"name": "t", "agents": ["a"], "environment": "python-code", "reward": "code-tests"}],
}


def job(warm_pool: int, *environments: str) -> jobconfig.EnvConfig:
    return jobconfig.EnvConfig(
        environments=frozenset(environments), user_modules=(), warm_pool=warm_pool, cpu_per_action="1"
    )


def test_warm_pool_from_the_job() -> None:
    assert env_main.warm_pool(None) == 0
    assert env_main.warm_pool(job(3, "python-code")) == 3


def test_warm_pool_only_for_a_pod_that_runs_python_code() -> None:
    # math-tool and frozenlake have nothing seed-independent to pre-start
    assert env_main.warm_pool(job(3, "math-tool")) == 0
    assert env_main.warm_pool(job(3, "math-tool", "python-code")) == 3


@pytest.mark.parametrize("size", [65, -1])
def test_bad_warm_pool_names_the_field(size: int) -> None:
    with pytest.raises(errors.SpecError) as info:
        v1alpha1.parse_spec({**SPEC, "environment": {"warmPool": size}})
    assert info.value.field == "spec.environment.warmPool"
