"""Runtime's single-flight refresh bookkeeping and the GPU-capacity cache."""

from __future__ import annotations

from typing import Any

from treadle.operator import config, metrics, runtime


class CountingKube:
    """Stands in for ``kube.Kube`` where only ``gpu_capacity`` is called."""

    def __init__(self) -> None:
        self.calls = 0

    def gpu_capacity(self) -> dict[str, int]:
        self.calls += 1
        return {"H800": 16}


def _runtime(kube: Any = None) -> runtime.Runtime:
    return runtime.Runtime(
        kube=kube, cfg=config.OperatorConfig(), metrics=metrics.OperatorMetrics(), kubeconfig=None
    )


def test_refresh_is_single_flight_and_reruns_once_after_a_burst() -> None:
    rt = _runtime()
    key = ("ns", "job")
    assert rt.begin_refresh(key)  # first caller refreshes
    assert not rt.begin_refresh(key)  # a burst while it runs...
    assert not rt.begin_refresh(key)  # ...is coalesced
    assert rt.refresh_again(key)  # so the first caller runs exactly once more
    assert not rt.refresh_again(key)  # and then stops
    assert rt.begin_refresh(key)  # the next event starts a new flight
    assert not rt.refresh_again(key)


def test_a_failed_refresh_releases_the_flight() -> None:
    rt = _runtime()
    key = ("ns", "job")
    assert rt.begin_refresh(key)
    assert not rt.begin_refresh(key)
    assert not rt.refresh_again(key, failed=True)
    assert rt.begin_refresh(key)


def test_jobs_refresh_independently() -> None:
    rt = _runtime()
    assert rt.begin_refresh(("ns", "a"))
    assert rt.begin_refresh(("ns", "b"))


def test_gpu_capacity_is_cached() -> None:
    kube = CountingKube()
    rt = _runtime(kube)
    assert rt.gpu_capacity() == {"H800": 16}
    assert rt.gpu_capacity() == {"H800": 16}
    assert kube.calls == 1


def test_state_is_shared_across_kopfs_shallow_copies() -> None:
    """kopf gives every object ``copy.copy(memo)``: caches and flights must still be shared."""
    import copy

    kube = CountingKube()
    root = _runtime(kube)
    a, b = copy.copy(root), copy.copy(root)
    assert a.gpu_capacity() == b.gpu_capacity() == {"H800": 16}
    assert kube.calls == 1
    assert a.begin_refresh(("ns", "job"))
    assert not b.begin_refresh(("ns", "job"))
    assert a.refresh_again(("ns", "job"))
