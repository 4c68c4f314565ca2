"""Session fixtures for the real backends, shared by every test tier.

A test's tier marker comes from its folder (tests/unit, tests/integration, tests/slow, e2e/), so
``pytest -m unit`` and friends select exactly one tier and nothing is left unmarked.

With ``TREADLE_FORBID_SKIPS=1`` (set by ``make test``, hence CI) a skipped test fails instead: a
missing prerequisite (vLLM, torch, root for the sandbox's network namespace) must not turn into a
quiet pass.
"""

from __future__ import annotations

import os
from collections.abc import Generator, Iterator
from pathlib import Path

import pluggy
import pytest

from treadle.devcluster import kwok
from treadle.testing import mooncake_master as mooncake_master_mod
from treadle.testing import redis_server as redis_server_mod

ROOT = Path(__file__).parent
TIER_BY_FOLDER = {
    ROOT / "tests" / "unit": "unit",
    ROOT / "tests" / "integration": "integration",
    ROOT / "tests" / "slow": "slow",
    ROOT / "e2e": "e2e",
}


GROUPS = {
    ROOT / "tests" / "slow": "real-vllm",
    ROOT / "e2e" / "demo": "dev-cluster",
    ROOT / "e2e" / "docs": "dev-cluster",
    ROOT / "e2e" / "learn": "dev-cluster",
}
"""Under pytest-xdist (``hack/run_tests.py``, ``pytest -n N``) one worker runs each of these groups'
tests one at a time, these groups first (the longest): real vLLM starts take both cores (beside three
at once, timing-sensitive tests failed), and the dev-cluster tests share the README's cluster name
and the node's host paths. Every other module is a group of its own, so its module fixtures start
once."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        path = Path(str(item.fspath)).resolve()
        tiers = [tier for folder, tier in TIER_BY_FOLDER.items() if folder in path.parents]
        if len(tiers) != 1:
            raise pytest.UsageError(f"{item.nodeid}: tests live in one of {sorted(map(str, TIER_BY_FOLDER))}")
        item.add_marker(getattr(pytest.mark, tiers[0]))
        if tiers[0] == "slow" and item.get_closest_marker("timeout") is None:
            # Real vLLM starts in one to several minutes on a busy 2-core machine (the suite's 300 s
            # default is for everything else).
            item.add_marker(pytest.mark.timeout(SLOW_TIMEOUT_S))
    if hasattr(config, "workerinput"):  # an xdist worker: the scheduler hands out groups in this order
        serial = list(GROUPS.values())
        items.sort(key=lambda item: _order(group_of(item.nodeid), serial))  # stable: modules keep order


def group_of(nodeid: str) -> str:
    """The group of the test ``nodeid``: one worker runs a group's tests in order."""
    path = ROOT / nodeid.split("::")[0]
    for folder, group in GROUPS.items():
        if folder in path.parents:
            return group
    return str(path.relative_to(ROOT))


def _order(group: str, serial: list[str]) -> int:
    return serial.index(group) if group in serial else len(serial)


@pytest.hookimpl(tryfirst=True)  # before xdist's own choice from --dist
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """Schedule by ``group_of``: xdist's scope scheduling, a scope being a group. (Its ``loadgroup``
    marks do not reach the scheduler under pytest 9, whose node ids no longer come from ``_nodeid``.)"""
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):  # type: ignore[misc]  # xdist is untyped
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

    config.option.loadscopereorder = False  # the collection's order (serial groups first) is the plan
    return GroupScheduling(config, log)


CLUSTER_UP_S = 480
"""A session cluster's start (``kwokctl create cluster``): 180 s by default, which three test workers
starting clusters at once on 2 cores overran (2026-11-29)."""
FORBID_SKIPS = os.environ.get("TREADLE_FORBID_SKIPS") == "1"
SLOW_TIMEOUT_S = 900


def _fail_skip(report: pytest.TestReport | pytest.CollectReport) -> None:
    if FORBID_SKIPS and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped, but TREADLE_FORBID_SKIPS=1 forbids skips: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pluggy.Result[pytest.TestReport], None]:
    outcome = yield
    _fail_skip(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(
    collector: pytest.Collector,
) -> Generator[None, pluggy.Result[pytest.CollectReport], None]:
    outcome = yield
    _fail_skip(outcome.get_result())


@pytest.fixture(scope="session")
def redis_server() -> Iterator[redis_server_mod.RedisServer]:
    """A real redis-server on a free 127.0.0.1 port for the whole session (flush per test yourself)."""
    with redis_server_mod.redis_server() as server:
        yield server


@pytest.fixture(scope="session")
def mooncake_master() -> Iterator[mooncake_master_mod.MooncakeMaster]:
    """A real mooncake_master with its embedded HTTP metadata server on 127.0.0.1."""
    with mooncake_master_mod.mooncake_master() as master:
        yield master


@pytest.fixture(scope="session")
def dev_cluster() -> Iterator[kwok.DevCluster]:
    """A real kube-apiserver, controller-manager and scheduler with KWOK H800/H20/CPU pools.

    The cluster is private to the test session (own name with the pid, own kubeconfig, free ports)
    and torn down after it; clusters of killed sessions are removed first.
    """
    cluster = kwok.session_cluster("treadle-e2e", kwok.cache_dir() / "kwok-e2e")
    cluster.up(timeout=CLUSTER_UP_S)
    try:
        yield cluster
    finally:
        cluster.down()


@pytest.fixture(scope="session")
def run_cluster() -> Iterator[kwok.DevCluster]:
    """A private control plane whose one node, ``treadle-run-0``, really runs its pods (node agent).

    No KWOK node: every pod that schedules runs.
    """
    cluster = kwok.session_cluster("treadle-run", kwok.cache_dir() / "kwok-e2e", pools=(), run_nodes=1)
    cluster.up(timeout=CLUSTER_UP_S)
    try:
        yield cluster
    finally:
        cluster.down()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama, generated once per session (no downloads; a few seconds of CPU)."""
    import torch

    from treadle.trainer import policy

    # One intra-op thread: two cores shared with other tests; more threads only contend.
    torch.set_num_threads(1)
    return policy.ensure_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)
