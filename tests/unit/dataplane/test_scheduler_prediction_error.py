"""The scheduler scores every remaining-length prediction of a completed trajectory (Prometheus)."""

from __future__ import annotations

import asyncio

import dataplane_fakes as fakes

from treadle import metrics
from treadle.api import jobconfig
from treadle.services.buffer import service as buffer_service
from treadle.services.buffer import store
from treadle.services.placement import service as placement_service
from treadle.services.scheduler import protocol, service
from treadle.v1 import placement_pb2

TASK = jobconfig.TaskConfig(name="math", env="math-tool", group_size=4, max_turns=3)


async def test_every_prediction_is_scored_when_the_trajectory_completes() -> None:
    placement = placement_service.PlacementService(
        pools={"decode": "decode-heavy"}, tasks={"math": jobconfig.TaskPlacement("decode-heavy")}
    )
    placement.register_worker(placement_pb2.Worker(worker_id="w0", pool="decode", address="a0"))
    svc = service.SchedulerService(
        tasks={"math": TASK},
        settings=jobconfig.Settings(alpha=1, batch_size=8, max_in_flight=64, backoff_s=0.0),
        envs=[fakes.Env()],
        agent_for=lambda address: fakes.Agent(),
        placement=placement_service.InProcess(placement),
        reward=fakes.Reward(),
        buffer=buffer_service.BufferService(store=store.MemoryStore(), alpha=1),
    )
    results = svc.results()
    await svc.submit([protocol.PromptGroup(group_id=g, task="math", seed=i) for i, g in enumerate("ab")])
    async with asyncio.timeout(10):
        done = []
        async for r in results:
            done.append(r)
            if len(done) == 8:
                break
    assert all(r.status == "completed" and r.output_tokens == 4 for r in done)  # 2 turns of 2 tokens

    def sample(suffix: str, steps: str) -> float | None:
        return svc.registry.get_sample_value(
            metrics.SCHED_PREDICTION_ERROR_TOKENS + suffix, {"steps_done": steps}
        )

    # one prediction at admission and one after each turn, for each of the 8 trajectories
    assert [sample("_count", s) for s in ("0", "1", "2", "3+")] == [8, 8, 8, None]
    # nothing was learned before admission, so each predicted 0 (the prior) against 4 to come
    assert sample("_sum", "0") == 8 * 4
    await svc.aclose()
