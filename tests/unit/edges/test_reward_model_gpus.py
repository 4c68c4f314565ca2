"""The reward gateway's GPU manager with a recording engine: one action per GPU, aligned chunks,
restores only where the variant is not resident, least recently used evicted first."""

from __future__ import annotations

import asyncio
import collections

import httpx
import prometheus_client
import pytest

from treadle import errors
from treadle.api import v1alpha1
from treadle.policy.tangram import buddy
from treadle.sandbox import cores
from treadle.services.reward import engines, gpus


class Recording:
    """An ``Engines`` that records what is resident where and the actions on each GPU."""

    def __init__(self) -> None:
        self.resident: set[tuple[str, int, buddy.Chunk]] = set()
        self.restores: list[tuple[str, int, buddy.Chunk]] = []
        self.evictions: list[tuple[str, int, buddy.Chunk]] = []
        self.client_ = httpx.AsyncClient()

    async def restore(self, rm: v1alpha1.RewardModel, degree: int, chunk: buddy.Chunk) -> float:
        await asyncio.sleep(0)
        self.resident.add((rm.name, degree, chunk))
        self.restores.append((rm.name, degree, chunk))
        return 0.001

    def evict(self, name: str, degree: int, chunk: buddy.Chunk) -> None:
        self.resident.remove((name, degree, chunk))
        self.evictions.append((name, degree, chunk))

    def client(self, name: str, degree: int, chunk: buddy.Chunk) -> httpx.AsyncClient:
        assert (name, degree, chunk) in self.resident
        return self.client_

    def served_name(self, name: str) -> str | None:
        return name

    async def aclose(self) -> None:
        await self.client_.aclose()


def rm(name: str, gb: float, parallelism: list[int]) -> v1alpha1.RewardModel:
    return v1alpha1.RewardModel(name=name, model=name, weights_gb=gb, parallelism=parallelism)


def manager(
    models: list[v1alpha1.RewardModel], gpus_: int, gpu_gb: float, engines: Recording
) -> gpus.GpuManager:
    registry = prometheus_client.CollectorRegistry()
    return gpus.GpuManager(
        models, gpus=gpus_, gpu_gb=gpu_gb, engines=engines, registry=registry,
        action_metrics=cores.ActionMetrics(registry),
    )  # fmt: skip


async def test_concurrent_actions_never_share_a_gpu_and_chunks_are_aligned() -> None:
    engines = Recording()
    m = manager([rm("a", 10, [1, 2]), rm("b", 10, [1])], 4, 80, engines)
    busy: collections.Counter[tuple[int, int]] = collections.Counter()
    most = 0

    async def act(name: str, hold_s: float) -> None:
        nonlocal most
        async with m.lease(name) as lease:
            chunk = lease.chunk
            assert chunk.start % chunk.size == 0 and chunk.size == lease.degree
            gpus_held = [(chunk.node, g) for g in range(chunk.start, chunk.end)]
            busy.update(gpus_held)
            assert max(busy.values()) == 1  # at most one action per GPU
            most = max(most, sum(busy.values()))
            await asyncio.sleep(hold_s)
            busy.subtract(gpus_held)

    async with asyncio.timeout(20):
        await asyncio.gather(*(act("ab"[i % 2], 0.01 * (1 + i % 3)) for i in range(24)))
    assert most <= 4 and m.free_gpus == 4
    assert m.pool.free == buddy.of_gpus(4, 80).free  # every chunk back, buddies merged
    await engines.aclose()


async def test_a_resident_variant_is_reused_and_the_least_recently_used_is_evicted() -> None:
    engines = Recording()
    # One GPU that holds one variant at a time (12 GB of 20): every switch of model evicts the other.
    m = manager([rm("a", 10, [1]), rm("b", 10, [1])], 1, 20, engines)
    for name in ("a", "a", "b", "a"):
        async with m.lease(name) as lease:
            assert lease.degree == 1
    chunk = buddy.Chunk(0, 0, 1)
    assert engines.restores == [("a", 1, chunk), ("b", 1, chunk), ("a", 1, chunk)]  # the 2nd "a" hit
    assert engines.evictions == [("a", 1, chunk), ("b", 1, chunk)]
    await engines.aclose()


async def test_the_queue_is_fcfs_when_the_gpus_are_busy() -> None:
    engines = Recording()
    m = manager([rm("a", 1, [1])], 1, 80, engines)
    order: list[int] = []
    held = asyncio.Event()

    async def act(i: int) -> None:
        async with m.lease("a"):
            order.append(i)
            if i == 0:
                held.set()
            await asyncio.sleep(0.005)

    first = asyncio.create_task(act(0))
    await held.wait()
    async with asyncio.timeout(10):
        await asyncio.gather(first, *(act(i) for i in range(1, 6)))
    assert order == list(range(6))
    await engines.aclose()


def test_a_model_that_never_fits_a_gpu_is_refused_naming_its_field() -> None:
    with pytest.raises(errors.SpecError) as info:
        manager([rm("ok", 1, [1]), rm("huge", 200, [1, 2])], 2, 80, Recording())
    assert info.value.field == "spec.externalResources.rewardModels[1].weightsGb"


async def test_an_undeclared_model_is_bad_input() -> None:
    engines = Recording()
    m = manager([rm("a", 1, [1])], 1, 80, engines)
    with pytest.raises(errors.SpecError, match="no reward model 'b'"):
        async with m.lease("b"):
            pass
    await engines.aclose()


async def test_a_degree_whose_shard_does_not_fit_a_gpu_is_never_granted() -> None:
    engines = Recording()
    m = manager([rm("big", 100, [1, 2, 4])], 4, 80, engines)  # 120 GB at TP1 never fits one GPU
    assert m.profiles["big"].amounts == (2, 4)
    for _ in range(4):
        async with m.lease("big") as lease:
            assert lease.degree in (2, 4)
    await engines.aclose()


class Starting(Recording):
    """An engine whose first restore of each variant fails as ``VllmEngines``' does while it starts."""

    def __init__(self) -> None:
        super().__init__()
        self.started: set[tuple[str, int, buddy.Chunk]] = set()

    async def restore(self, rm: v1alpha1.RewardModel, degree: int, chunk: buddy.Chunk) -> float:
        if (rm.name, degree, chunk) not in self.started:
            self.started.add((rm.name, degree, chunk))
            raise errors.Unavailable("starting")
        return await super().restore(rm, degree, chunk)


async def test_a_failed_restore_gives_the_gpu_back_and_the_next_grant_restores_again() -> None:
    engines = Starting()
    m = manager([rm("a", 10, [1])], 1, 80, engines)
    with pytest.raises(errors.Unavailable):
        async with m.lease("a"):
            pass
    assert m.free_gpus == 1 and not engines.restores
    async with m.lease("a") as lease:  # not taken for resident: restored this time
        assert lease.restore_s > 0
    assert engines.restores == [("a", 1, buddy.Chunk(0, 0, 1))]


def test_vllm_engines_get_sleep_mode_and_their_gpu_share_on_cuda_and_float32_on_cpu() -> None:
    judge = v1alpha1.RewardModel(
        name="j", model="/models/j", weights_gb=20, parallelism=[1, 2], engine="vllm",
        engine_args=["--max-model-len", "4096"],
    )  # fmt: skip
    cuda = engines.vllm_argv(judge, 2, port=8001, cuda=True, gpu_gb=80)
    assert cuda[cuda.index("--tensor-parallel-size") + 1] == "2" and "--enable-sleep-mode" in cuda
    assert cuda[cuda.index("--gpu-memory-utilization") + 1] == "0.150"  # 10 GB shard x 1.2 of 80
    assert cuda[-2:] == ["--max-model-len", "4096"] and "--served-model-name" in cuda
    cpu = engines.vllm_argv(judge, 1, port=8001, cuda=False, gpu_gb=80)
    assert "--enable-sleep-mode" not in cpu and cpu[cpu.index("--dtype") + 1] == "float32"
    assert cpu[cpu.index("--worker-extension-cls") + 1] == engines.VLLM_EXTENSION


class Dying(Recording):
    """An engine that dies once while its variant is resident, as ``VllmEngines.client`` then reports."""

    def __init__(self) -> None:
        super().__init__()
        self.dead = False

    def client(self, name: str, degree: int, chunk: buddy.Chunk) -> httpx.AsyncClient:
        if self.dead:
            self.dead = False
            self.resident.discard((name, degree, chunk))
            raise errors.Unavailable("exited")
        return super().client(name, degree, chunk)


async def test_a_variant_whose_engine_died_is_restored_on_the_next_grant() -> None:
    engines = Dying()
    m = manager([rm("a", 10, [1])], 1, 80, engines)
    async with m.lease("a"):
        pass
    engines.dead = True
    with pytest.raises(errors.Unavailable):
        async with m.lease("a"):
            pass
    async with m.lease("a") as lease:
        assert lease.restore_s > 0
    assert len(engines.restores) == 2
