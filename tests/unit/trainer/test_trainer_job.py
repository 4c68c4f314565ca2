"""The reference trainer in the job: its config from the job file, its model, its workers, its SDK.

``treadle.trainer.job`` against the real services is ``tests/integration/dataplane/
test_trainer_job_rendered.py``; here the parts that need no process: ``jobconfig.trainer_config``,
``job.model_path`` (the tiny Llama generated from its folder's name), the swapper's choice of
workers, and ``treadle.client.connect`` finding every endpoint in the pod's environment.
"""

from __future__ import annotations

import asyncio
import json
import pathlib
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from treadle import errors
from treadle.api import env_vars, jobconfig, v1alpha1
from treadle.client import connect, retrying
from treadle.services.placement import protocol as placement_protocol
from treadle.trainer import checkpoint, group, parallel, policy, sharded, step
from treadle.trainer import job as trainer_job
from treadle.weights import objects

SPEC: dict[str, Any] = {
    "agents": [{"name": "planner", "model": "/models/p"}, {"name": "coder", "model": "/models/c"}],
    "pools": [
        {"name": "plan", "agent": "planner", "accelerator": "H20"},
        {"name": "code", "agent": "coder", "accelerator": "H800", "replicas": 2},
    ],
    "tasks": [{"name": "t", "agents": ["planner", "coder"], "environment": "math-tool", "reward": "math"}],
    "rollout": {"batchSize": 32, "staleness": 2},
    "weights": {"replicas": 3},
    "trainer": {"agent": "coder", "steps": 7, "learningRate": 1e-4, "clipHigh": 0.28},
}


SINGLE: dict[str, Any] = {
    **{k: v for k, v in SPEC.items() if k not in ("agents", "pools", "tasks", "trainer")},
    "agents": [{"name": "default", "model": "/models/p"}],
    "pools": [{"name": "plan", "agent": "default", "accelerator": "H20"}],
    "tasks": [{"name": "t", "agents": ["default"], "environment": "math-tool", "reward": "math"}],
}


def config(spec: dict[str, Any] = SPEC) -> jobconfig.JobConfig:
    job = v1alpha1.RolloutJob(metadata={"name": "j", "namespace": "ns"}, spec=v1alpha1.parse_spec(spec))
    return jobconfig.job_config(job, max_tokens=64, max_in_flight=64, max_concurrent_generations=8)


def test_the_trainer_config_takes_the_rollout_settings_from_the_job() -> None:
    cfg = config().trainer
    assert cfg == jobconfig.TrainerConfig(
        agent="coder", model="/models/c", steps=7, batch_size=32, alpha=2, lr=1e-4, clip_low=0.2,
        clip_high=0.28, temperature=1.0, threads=None, batch_timeout_s=600.0, weights_replicas=3,
    )  # fmt: skip
    loop_cfg, settings = trainer_job.loop_config(cfg), trainer_job.step_settings(cfg)
    assert (loop_cfg.steps, loop_cfg.batch_size, settings.loss.clip_high) == (7, 32, 0.28)
    assert (settings.micro_batch_tokens, settings.max_grad_norm, cfg.bf16, cfg.activation_checkpointing) == (
        None, None, False, False,
    )  # fmt: skip
    tuned = config({
        **SPEC, "trainer": {**SPEC["trainer"], "microBatchTokens": 512, "maxGradNorm": 1.0, "gpus": 2,
                            "activationCheckpointing": True},
    }).trainer  # fmt: skip
    assert tuned is not None and trainer_job.step_settings(tuned).micro_batch_tokens == 512
    assert (tuned.max_grad_norm, tuned.bf16, tuned.activation_checkpointing) == (1.0, True, True)
    assert config({k: v for k, v in SPEC.items() if k != "trainer"}).trainer is None


def test_a_tiny_llama_path_is_generated_deterministically(
    tmp_path: pathlib.Path, tiny_model_dir: pathlib.Path
) -> None:
    made = trainer_job.model_path(str(tmp_path / "tiny-llama-seed0"))
    assert made == tmp_path / "tiny-llama-seed0"
    for name in ("model.safetensors", "tokenizer.json"):
        assert (made / name).read_bytes() == (tiny_model_dir / name).read_bytes(), name
    assert trainer_job.model_path(str(tiny_model_dir)) == tiny_model_dir  # an existing folder as is


def test_a_model_neither_here_nor_cached_is_not_found(tmp_path: pathlib.Path) -> None:
    with pytest.raises(errors.NotFound):
        trainer_job.model_path(str(tmp_path / "no-such-model"))


async def test_a_job_without_a_trainer_names_the_field(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "job.json"
    path.write_text(json.dumps({k: v for k, v in SPEC.items() if k != "trainer"}))
    with pytest.raises(errors.SpecError) as info:
        await trainer_job.run({env_vars.CONFIG: str(path), env_vars.JOB: "j"})
    assert info.value.field == f"{env_vars.CONFIG}:spec.trainer"


class Placement:
    """Placement's weight-sync RPCs, recording what the trainer asked of them."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, str]] = []

    async def prefetch_weights(self, version: int, *, agent: str = "") -> Any:
        self.calls.append(("prefetch", version, agent))
        return placement_protocol.SwapResult(version=version, agent=agent, workers=())

    async def swap_weights(self, version: int, *, agent: str = "", timeout_s: float = 0.0) -> Any:
        self.calls.append(("swap", version, agent))
        done = placement_protocol.WorkerSwap(worker_id="code-0", pool="code", outcome="swapped")
        return placement_protocol.SwapResult(version=version, agent=agent, workers=(done,))


@pytest.mark.parametrize(("spec", "agent"), [(SPEC, "coder"), (SINGLE, "")])
async def test_the_swapper_asks_placement_for_the_trained_agents_workers(
    spec: dict[str, Any], agent: str
) -> None:
    """Placement, not the trainer, swaps the workers; a multi-agent job names the trained agent."""
    conn: Any = type("Conn", (), {"placement": Placement()})()
    swapper = trainer_job.swapper(conn, config(spec), "coder" if agent else "default")
    await swapper.prefetch(3)
    await swapper.swap(3)
    assert conn.placement.calls == [("prefetch", 3, agent), ("swap", 3, agent)]


def pod_env(tmp_path: pathlib.Path) -> dict[str, str]:
    return {
        env_vars.SCHEDULER_ADDR: "j-scheduler.ns.svc:50051",
        env_vars.BUFFER_ADDR: "j-buffer.ns.svc:50053",
        env_vars.PLACEMENT_ADDR: "j-placement.ns.svc:50052",
        env_vars.WEIGHTS_PREFIX: "ns/j",
        env_vars.WEIGHTS_AGENT: "coder",
        env_vars.WEIGHTS_DIR: str(tmp_path / "node"),
        env_vars.REDIS_URL: "redis://x",  # not the SDK's
    }


async def test_connect_finds_every_endpoint_in_the_pod(tmp_path: pathlib.Path) -> None:
    conn = connect.connect(environ=pod_env(tmp_path), keep_versions=3)
    try:
        assert conn.endpoints.scheduler == "j-scheduler.ns.svc:50051"
        assert (conn.endpoints.buffer, conn.endpoints.placement) == (
            "j-buffer.ns.svc:50053",
            "j-placement.ns.svc:50052",
        )
        # The trained agent's versions, in the store the engines of its pools read.
        assert conn.weights.prefix == "ns/j/coder" and conn.weights.staleness_window == 2
        assert (
            isinstance(conn.weights.store, objects.FileStore) and conn.weights.store.root == tmp_path / "node"
        )
        assert conn.publisher.committer is conn.scheduler
        assert conn.batches(batch_size=4).batch_size == 4
    finally:
        await conn.aclose()


async def test_a_trainer_outside_the_job_passes_addresses(tmp_path: pathlib.Path) -> None:
    endpoints = connect.Endpoints.from_env(
        pod_env(tmp_path), scheduler="10.0.0.1:1", buffer="10.0.0.2:2", placement="10.0.0.3:3",
        weights_dir=str(tmp_path / "mine"), weights_prefix="ns/other",
    )  # fmt: skip
    # The pod's store is replaced whole, not merged: no Mooncake variable survives beside a directory.
    mine = {env_vars.WEIGHTS_DIR: str(tmp_path / "mine"), env_vars.WEIGHTS_PREFIX: "ns/other"}
    assert endpoints.weights == {env_vars.WEIGHTS_AGENT: "coder", **mine}
    alone = connect.Endpoints.from_env(
        {}, scheduler="10.0.0.1:1", buffer="10.0.0.2:2", placement="10.0.0.3:3",
        weights_dir=str(tmp_path / "mine"), weights_prefix="ns/other",
    )  # fmt: skip
    assert alone.weights == {
        "TREADLE_WEIGHTS_DIR": str(tmp_path / "mine"),
        "TREADLE_WEIGHTS_PREFIX": "ns/other",
    }
    conn = connect.connect(endpoints)
    try:
        assert (conn.endpoints.scheduler, conn.endpoints.buffer, conn.endpoints.placement) == (
            "10.0.0.1:1", "10.0.0.2:2", "10.0.0.3:3",
        )  # fmt: skip
        assert (
            isinstance(conn.weights.store, objects.FileStore) and conn.weights.store.root == tmp_path / "mine"
        )
    finally:
        await conn.aclose()


@pytest.mark.parametrize("drop", [env_vars.BUFFER_ADDR, env_vars.WEIGHTS_PREFIX], ids=["buffer", "prefix"])
async def test_connect_names_what_is_missing(tmp_path: pathlib.Path, drop: str) -> None:
    environ = {k: v for k, v in pod_env(tmp_path).items() if k != drop}
    with pytest.raises(errors.SpecError) as info:
        connect.connect(environ=environ)
    assert info.value.field == drop


class Flaky:
    """A service that is ``Unavailable`` for its first ``down`` calls; the clock moves by each wait."""

    def __init__(self, down: int) -> None:
        self.down = down
        self.calls = 0
        self.now = 0.0
        self.waits: list[float] = []

    async def call(self) -> str:
        self.calls += 1
        if self.calls <= self.down:
            raise errors.Unavailable("scheduler.Stats: DNS resolution failed for j-scheduler:50051")
        return "stats"

    async def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.now += seconds


async def test_the_first_call_waits_for_a_service_not_up_yet_saying_what_for(
    caplog: pytest.LogCaptureFixture,
) -> None:
    svc = Flaky(down=6)
    caplog.set_level("INFO", logger=retrying.__name__)
    got = await connect.wait_for(
        svc.call, what="the scheduler at j-scheduler:50051", clock=lambda: svc.now, sleep=svc.sleep
    )
    assert got == "stats" and svc.calls == 7
    assert svc.waits == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0]  # doubling, bounded
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 6 and all("waiting for the scheduler at j-scheduler:50051" in m for m in said)
    assert "DNS resolution failed" in said[0]


async def test_a_service_that_never_comes_up_fails_naming_it_after_the_timeout() -> None:
    svc = Flaky(down=1000)
    with pytest.raises(errors.Unavailable, match="the scheduler at s:1 did not answer within 30s"):
        await connect.wait_for(
            svc.call, what="the scheduler at s:1", timeout_s=30.0, clock=lambda: svc.now, sleep=svc.sleep
        )
    assert sum(svc.waits) <= 30.0 and svc.calls == len(svc.waits) + 1


async def test_other_errors_are_not_waited_out() -> None:
    async def refused() -> str:
        raise errors.SpecError("bad", field="x")

    with pytest.raises(errors.SpecError):
        await connect.wait_for(refused, what="the scheduler", sleep=Flaky(0).sleep)


@pytest.fixture
def world() -> Iterator[parallel.World]:
    yield parallel.init({})
    parallel.close()


def learner(
    pol: policy.Policy, conn: connect.Connection, world: parallel.World, *, state: bool
) -> group.Group:
    parallel.shard(pol.model, world, bf16=False, checkpointing=False)
    kept = (
        checkpoint.OptimizerStore(conn.weights.store, conn.weights.prefix, keep_versions=3) if state else None
    )
    return group.Group(
        world, pol, lr=1e-3, settings=step.Settings(), weights=conn.weights, optimizer_store=kept
    )


async def test_a_restarted_trainer_loads_the_weights_the_job_committed(
    tmp_path: pathlib.Path, tiny_model_dir: pathlib.Path, world: parallel.World
) -> None:
    """``Group.resume``: the committed version's tensors, from the job's weight store, replace the base
    checkpoint's; a version the store no longer holds is NotFound, naming it."""
    conn = connect.connect(environ=pod_env(tmp_path), keep_versions=3)
    try:
        trained = policy.load(tiny_model_dir)
        with torch.no_grad():
            for p in trained.model.parameters():
                p.add_(0.5)
        await asyncio.to_thread(conn.weights.publish, trained.model.state_dict(), 4)
        fresh = learner(policy.load(tiny_model_dir), conn, world, state=False)
        assert fresh.resume(4) is False  # no optimizer store: weights only
        got, want = fresh.state_dict(), trained.model.state_dict()
        assert all(torch.equal(got[k], want[k]) for k in want)
        with pytest.raises(errors.NotFound, match="version 9"):
            fresh.resume(9)
    finally:
        await conn.aclose()


def adam_steps(pol: policy.Policy, optimizer: torch.optim.Optimizer, tokens: torch.Tensor, n: int) -> None:
    for _ in range(n):
        loss = pol.model(tokens).logits.float().pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


async def test_a_restarted_trainer_makes_the_update_an_uninterrupted_one_would(
    tmp_path: pathlib.Path, tiny_model_dir: pathlib.Path, world: parallel.World
) -> None:
    """``checkpoint.OptimizerStore``: Adam's state published beside a version and restored with its
    weights gives exactly the next update of a trainer that never stopped; Adam from zero does not."""
    tokens = torch.randint(0, 100, (2, 12), generator=torch.Generator().manual_seed(0))
    conn = connect.connect(environ=pod_env(tmp_path), keep_versions=3)
    try:
        ran = learner(policy.load(tiny_model_dir), conn, world, state=True)
        adam_steps(ran.policy, ran.optimizer, tokens, 2)
        await asyncio.to_thread(sharded.publish_parts, conn.weights, ran.policy.model.state_dict(), 2, world)
        assert ran.optimizer_store is not None
        ran.optimizer_store.save(2, ran.policy.model, ran.optimizer, world)

        restarted: list[group.Group] = []
        for with_state in (True, False):
            back = learner(policy.load(tiny_model_dir), conn, world, state=with_state)
            assert back.resume(2) is with_state
            restarted.append(back)
        for g in [ran, *restarted]:
            adam_steps(g.policy, g.optimizer, tokens, 1)
        want = ran.state_dict()
        back_sd, from_zero_sd = (g.state_dict() for g in restarted)
        assert all(torch.equal(want[k], back_sd[k]) for k in want)
        assert not all(torch.equal(want[k], from_zero_sd[k]) for k in want)
        # A version whose state the store does not hold: said, not guessed.
        assert not ran.optimizer_store.load(9, ran.policy.model, ran.optimizer)
        # The engines' versions are untouched by it: the weights' newest is still 2, with no state beside.
        assert conn.weights.latest == 2
    finally:
        await conn.aclose()
