"""Issue #18's fault suite on real processes: each component of a local stack (Redis with its AOF
on disk, buffer, placement, the env server, the reward gateway, an agent, an engine, the trainer)
is SIGKILLed mid-run and started again; the run completes with every submitted trajectory finished
and stored exactly once, and no row trained twice. The engine and the trainer are SIMULATED
(``treadle.services.fakevllm``; ``localmode.trainer.simulated_trainer``, no gradient step)."""

from __future__ import annotations

from pathlib import Path

import faults_harness as harness
import pytest

N = 32

CASES = {
    # component: (fault, stages whose failures it may cause; () = none may fail)
    "redis": (harness.Fault("redis"), ()),
    "buffer": (harness.Fault("buffer"), ()),
    "placement": (harness.Fault("placement"), ()),
    "env": (harness.Fault("env-0"), ()),  # its lost sessions run again from their start
    "reward": (harness.Fault("reward"), ()),
    "agent": (harness.Fault("agent-decode-0"), ()),
    "engine": (harness.Fault("engine-decode-0"), ()),
    # Later than the rest: by then batches are flowing, so the kill lands inside a training step.
    "trainer": (harness.Fault("trainer", after_turns=60), ()),
}


@pytest.mark.parametrize(("fault", "may_fail"), CASES.values(), ids=list(CASES))
async def test_component_killed_mid_run_loses_nothing(
    tmp_path: Path, fault: harness.Fault, may_fail: tuple[str, ...]
) -> None:
    out = await harness.run_with_fault(tmp_path / "run", fault, trajectories=N, timeout_s=120.0)
    harness.check_exactly_once(out, trajectories=N, may_fail=may_fail)


async def test_scheduler_killed_mid_run_goes_on_from_its_journal(tmp_path: Path) -> None:
    """The scheduler holds accepted groups and in-flight trajectories in memory; killed, the new one
    takes up from its journal in Redis (``scheduler.journal``) every group not wholly stored and the
    committed version. Judged by the buffer, which outlives both schedulers: every trajectory stored
    exactly once, none trained twice. A member run again because its stored-mark had not reached Redis
    when the process died is stored once all the same (the buffer's put is idempotent; counted as a
    duplicate)."""
    out = await harness.run_with_fault(
        tmp_path / "run", harness.Fault("scheduler"), trajectories=N, timeout_s=120.0
    )
    harness.check_taken_up_after_restart(out, trajectories=N)
