"""The scheduler's DARTS part (``treadle.services.scheduler.darts``) with in-process fakes.

The real ``PlacementService`` and ``BufferService`` (memory store); a fake agent whose answer length
is set per trajectory and which can hold a generation until it is released or aborted; the fake env
(one step per trajectory). Real processes, real Redis and fakevllm: tests/integration/dataplane.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Callable, Collection, Sequence

import dataplane_fakes as fakes
import pytest

from treadle import metrics
from treadle.api import jobconfig
from treadle.policy import grpo
from treadle.policy.darts import budget, stats
from treadle.services.agent import protocol as agent_protocol
from treadle.services.buffer import service as buffer_service
from treadle.services.buffer import store
from treadle.services.placement import service as placement_service
from treadle.services.reward import protocol as reward_protocol
from treadle.services.scheduler import darts, darts_store, protocol, service
from treadle.v1 import buffer_pb2, placement_pb2

M = 4


def task(mode: str = "darts", **kw: object) -> jobconfig.TaskConfig:
    darts_kw: dict[str, object] = {"m_up": 2 * M, "long_end": 1, "lam": 0.04, "ema_decay": 0.5}
    return jobconfig.TaskConfig(
        name="math", env="math-tool", group_size=M, max_turns=1, max_tokens=64, sampling=mode,
        **{**(darts_kw if mode == "darts" else {}), **kw},  # type: ignore[arg-type]
    )  # fmt: skip


class LengthAgent:
    """Answers ``length(trajectory id)`` tokens; holds the ids in ``hold`` until ``release``d (or aborted)."""

    def __init__(self, length: Callable[[str], int], hold: Collection[str] = ()) -> None:
        self.length, self.hold = length, set(hold)
        self.events: dict[str, asyncio.Event] = {}
        self.aborted: list[str] = []

    async def generate(self, req: agent_protocol.GenerateRequest) -> agent_protocol.GenerateResult:
        tid = req.trajectory_id
        if tid in self.hold:
            await self.events.setdefault(tid, asyncio.Event()).wait()
        n = self.length(tid)
        return agent_protocol.GenerateResult(
            trajectory_id=tid, text="a", prompt_token_ids=[1], output_token_ids=[5] * n,
            output_logprobs=[-0.5] * n, output_versions=[0] * n, finish_reason="stop",
        )  # fmt: skip

    async def abort(self, trajectory_id: str) -> bool:
        self.aborted.append(trajectory_id)
        return True

    def release(self, *tids: str) -> None:
        for tid in tids:
            self.events.setdefault(tid, asyncio.Event()).set()


class HashReward(fakes.Reward):
    """+1 or -1 by the trajectory id: rewards that differ within a group, the same in every run."""

    async def score(self, req: reward_protocol.ScoreRequest) -> reward_protocol.ScoreResult:
        reward = 1.0 if zlib.crc32(req.trajectory_id.encode()) % 2 else -1.0
        tid = req.trajectory_id
        return reward_protocol.ScoreResult(trajectory_id=tid, reward=reward, details={}, cached=False)


class Stack:
    def __init__(
        self, t: jobconfig.TaskConfig, agent: LengthAgent, *, saved: darts_store.StatsStore | None = None
    ) -> None:
        self.env = fakes.Env(steps=1)
        self.agent = agent
        self.placement = placement_service.PlacementService(
            pools={"decode": "decode-heavy"}, tasks={"math": jobconfig.TaskPlacement("decode-heavy")}
        )
        self.placement.register_worker(placement_pb2.Worker(worker_id="w0", pool="decode", address="a0"))
        self.buffer = buffer_service.BufferService(store=store.MemoryStore(), alpha=8)
        self.svc = service.SchedulerService(
            tasks={"math": t},
            settings=jobconfig.Settings(alpha=8, batch_size=64, max_in_flight=256, backoff_s=0.0),
            envs=[self.env], agent_for=lambda address: self.agent,
            placement=placement_service.InProcess(self.placement), reward=HashReward(), buffer=self.buffer,
            darts_stats=saved,
        )  # fmt: skip

    async def submit(self, n: int) -> None:
        await self.svc.submit([protocol.PromptGroup(group_id=f"g{i}", task="math", seed=i) for i in range(n)])

    async def until(self, done: Callable[[], bool]) -> None:
        """Poll ``done`` (bounded: 10 s), then let the event loop run a little more."""
        async with asyncio.timeout(10):
            while not done():  # noqa: ASYNC110 - the scheduler has no event for these states
                await asyncio.sleep(0.005)
        await asyncio.sleep(0.05)

    async def settled(self) -> protocol.Stats:
        """Wait until nothing is pending, in flight or unsaved."""
        s = self.svc.stats
        await self.until(lambda: not (s().pending or s().in_flight or s().unsaved or self.svc.darts.pools))
        return s()

    async def batch(self, size: int) -> buffer_pb2.Batch:
        return await self.buffer.get_batch(batch_size=size, version=0, timeout_s=0)

    def sample(self, name: str, **labels: str) -> float:
        return self.svc.registry.get_sample_value(name, labels) or 0.0


def groups_of(batch: buffer_pb2.Batch) -> dict[str, list[tuple[str, int, float]]]:
    out: dict[str, list[tuple[str, int, float]]] = {}
    for t in sorted(batch.trajectories, key=lambda t: t.trajectory_id):
        out.setdefault(t.group_id, []).append((t.trajectory_id, t.group_size, t.reward))
    return out


def advantages(batch: buffer_pb2.Batch) -> dict[str, float]:
    ts = sorted(batch.trajectories, key=lambda t: t.trajectory_id)
    adv = grpo.group_advantages([t.reward for t in ts], [t.group_id for t in ts])
    return {t.trajectory_id: a for t, a in zip(ts, adv, strict=True)}


def force_pools(monkeypatch: pytest.MonkeyPatch, pools: Sequence[int]) -> None:
    """The planner's answer, fixed (the plan itself is pinned in tests/unit/policy/darts)."""
    monkeypatch.setattr(darts.plan, "pools", lambda state, prompts, *a, **kw: (list(pools), sum(pools)))


def length_by_index(lengths: Sequence[int]) -> Callable[[str], int]:
    return lambda tid: lengths[int(tid.rsplit("-", 1)[1])]


async def test_budget_n_times_m_reproduces_standard_grpo_exactly() -> None:
    """Cold start (no statistics, no fitted latency): every pool is M, every group the whole pool, so
    the buffer holds the same groups, members, rewards and advantages as a standard task's."""
    runs = {}
    for mode in ("standard", "darts"):
        st = Stack(task(mode), LengthAgent(lambda tid: 1 + zlib.crc32(tid.encode()) % 30))
        await st.submit(3)
        s = await st.settled()
        assert (s.completed, s.aborted, s.submitted) == (3 * M, 0, 3 * M)
        batch = await st.batch(3 * M)
        runs[mode] = (groups_of(batch), advantages(batch))
        await st.svc.aclose()
    assert runs["darts"] == runs["standard"]
    assert len(runs["darts"][0]) == 3 and all(len(g) == M for g in runs["darts"][0].values())


async def test_saturated_group_stops_early_and_aborts_the_surplus(monkeypatch: pytest.MonkeyPatch) -> None:
    force_pools(monkeypatch, [2 * M])  # M_up: shortest-only with early stop
    surplus = {f"g0-{i}" for i in range(M, 2 * M)}
    st = Stack(task(), LengthAgent(lambda tid: 10, hold=surplus))
    results = st.svc.results()
    await st.submit(1)
    s = await st.settled()
    assert sorted(st.agent.aborted) == sorted(surplus)  # a real ABORT on the worker, per surplus candidate
    assert st.env.sessions == {} and set(st.env.closed) == {f"g0-{i}" for i in range(2 * M)}
    assert (s.submitted, s.completed, s.aborted) == (2 * M, M, M)
    assert s.submitted == s.pending + s.in_flight + s.unsaved + s.completed + s.failed + s.aborted
    batch = await st.batch(M)
    assert sorted(t.trajectory_id for t in batch.trajectories) == [f"g0-{i}" for i in range(M)]
    assert {t.group_size for t in batch.trajectories} == {M}
    streamed = []
    async with asyncio.timeout(5):
        async for r in results:
            streamed.append((r.trajectory_id, r.status, r.reason))
            if len(streamed) == 2 * M:
                break
    assert {r for r in streamed if r[0] in surplus} == {
        (tid, "aborted", darts.EARLY_STOP + ": 4 valid candidates are in") for tid in surplus
    }
    assert st.sample(metrics.SCHED_DARTS_CANDIDATES_TOTAL, task="math") == 2 * M
    assert st.sample(metrics.SCHED_DARTS_SELECTED_TOTAL, task="math") == M
    assert st.sample(metrics.SCHED_DARTS_ABORTED_TOTAL, task="math", reason="early_stop") == M
    assert st.sample(metrics.SCHED_DARTS_BUDGET, task="math") == 2 * M
    # the aborted candidates count at the M-th valid length (10), not at the 0 tokens the agent kept
    assert st.svc.darts.state["math"].variances["0:"] == 0.0
    await st.svc.aclose()


async def test_early_stop_waits_for_valid_candidates_not_truncated_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two candidates hit max_tokens (64): they do not count toward M, so the fourth valid one decides."""
    force_pools(monkeypatch, [2 * M])
    held = {"g0-5", "g0-6", "g0-7"}
    st = Stack(task(), LengthAgent(length_by_index([64, 64, 5, 6, 7, 8, 9, 10]), hold=held))
    await st.submit(1)
    await st.until(lambda: st.svc.stats().in_flight == len(held))
    assert st.agent.aborted == [] and st.svc.stats().in_flight == 3  # five in, only three valid
    st.agent.release("g0-5")
    await st.settled()
    assert sorted(st.agent.aborted) == ["g0-6", "g0-7"]
    batch = await st.batch(M)
    assert sorted(t.trajectory_id for t in batch.trajectories) == ["g0-2", "g0-3", "g0-4", "g0-5"]
    await st.svc.aclose()


async def test_dual_end_group_waits_for_the_pool_then_selects(monkeypatch: pytest.MonkeyPatch) -> None:
    force_pools(monkeypatch, [M + 2])  # below M_up: dual-end, K = 3 shortest + L = 1 longest valid
    lengths = [30, 5, 64, 7, 9, 40]  # g0-2 truncated (max_tokens 64): never the long end
    st = Stack(task(), LengthAgent(length_by_index(lengths), hold={"g0-5"}))
    await st.submit(1)
    await st.until(lambda: st.svc.stats().in_flight == 1)
    assert st.svc.stats().completed == 0  # five candidates are in; nothing is stored before the pool is
    st.agent.release("g0-5")
    s = await st.settled()
    assert st.agent.aborted == []  # dual-end aborts nothing
    assert (s.completed, s.aborted) == (M, 2)
    batch = await st.batch(M)
    assert sorted(t.trajectory_id for t in batch.trajectories) == ["g0-1", "g0-3", "g0-4", "g0-5"]
    assert st.sample(metrics.SCHED_DARTS_UNSELECTED_TOTAL, task="math") == 2
    await st.svc.aclose()


async def test_keep_unselected_stores_them_aborted_and_the_trainer_still_gets_m(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    force_pools(monkeypatch, [M + 2])
    st = Stack(task(keep_unselected=True), LengthAgent(length_by_index([30, 5, 64, 7, 9, 40])))
    await st.submit(1)
    s = await st.settled()
    assert (s.completed, s.aborted) == (M, 2)
    counters = await st.buffer.store.counters()
    assert (counters.completed, counters.aborted) == (M, 2)  # the unselected are in the buffer
    batch = await st.batch(M)
    assert sorted(t.trajectory_id for t in batch.trajectories) == ["g0-1", "g0-3", "g0-4", "g0-5"]
    assert {t.group_size for t in batch.trajectories} == {M + 2}
    await st.svc.aclose()


async def test_statistics_are_saved_per_step_and_loaded_by_a_new_scheduler() -> None:
    saved = darts_store.MemoryStats()
    st = Stack(task(), LengthAgent(lambda tid: 3 + 7 * int(tid.rsplit("-", 1)[1])), saved=saved)
    await st.submit(2)
    await st.settled()
    await st.svc.aclose()  # waits for the save
    state = await saved.load("math")
    assert state is not None and set(state.variances) == {"0:", "1:"}  # prompt keys: seed and options
    assert state.variances["0:"] == pytest.approx(61.25)  # population variance of 3, 10, 17, 24
    again = Stack(task(), LengthAgent(lambda tid: 3), saved=saved)
    await again.svc.darts.ready()
    assert again.svc.darts.state["math"] == state
    await again.svc.aclose()


async def test_a_fitted_latency_and_length_spread_size_pools_above_m() -> None:
    """The real plan: once the latency is fitted and lengths spread, the budget goes above N·M and the
    widest prompt gets the most candidates."""
    st = Stack(task(lam=3.0), LengthAgent(lambda tid: 3))
    latency = st.svc.darts.latency
    latency.samples.extend((b, 0.01 + 0.0005 * b) for b in (1, 2, 4, 8, 16, 32))
    latency.workers.add("w0")
    spread = {str(i): stats.Observation((10, 10 + 40 * i, 20, 10 + 80 * i)) for i in range(3)}
    st.svc.darts.state["math"] = stats.update(stats.Stats(), {f"{k}:": v for k, v in spread.items()})
    await st.submit(3)
    assert isinstance(latency.fitted(), budget.Ptl)
    # M* = S_t / (lambda alpha) = 18 here; Alg. 1 gives the widest prompt the cap, the narrowest M
    assert [p.work.members for p in st.svc.darts.pools.values()] == [4, 6, 8]
    assert st.sample(metrics.SCHED_DARTS_BUDGET, task="math") == 18
    await st.settled()
    await st.svc.aclose()


def test_latency_is_unfitted_below_four_batch_bins_and_measures_batch_and_seconds() -> None:
    now = [0.0]
    latency = darts.Latency(clock=lambda: now[0])
    first, second = latency.measure("w0"), latency.measure("w0")
    now[0] = 1.0
    second(100)
    first(0)  # aborted: no sample
    assert list(latency.samples) == [(2, 0.01)] and latency.generating["w0"] == 0
    assert latency.fitted() is None
    latency.samples.extend([(1, 0.01), (4, 0.012), (8, 0.02)])
    assert latency.fitted() is not None
