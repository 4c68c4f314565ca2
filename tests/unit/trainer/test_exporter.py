"""The reference trainer's step metrics: one sample per step, weight sync from the second step on."""

from __future__ import annotations

import prometheus_client as prom

from treadle import metrics
from treadle.trainer import exporter, grpo, loop


def record(step: int) -> loop.StepRecord:
    stats = grpo.LossStats(
        loss=0.5, policy_loss=0.4, kl=0.01, clip_fraction=0.2, behaviour_kl=0.03, tokens=64
    )
    return loop.StepRecord(
        step=step, version=step - 1, published=step, batch_id=f"b{step}", samples=8, tokens=64,
        mean_reward=0.25, staleness=1,
        token_versions=(0, 1), evicted_groups=0, swap_s=0.3, train_s=1.5, publish_s=0.2, stats=stats,
        aborted_on_commit=0, wait_s=2.0, published_bytes=1000, entropy=2.5, grad_norm=0.75,
        trained_tokens=300,
    )  # fmt: skip


def test_each_step_sets_the_gauges_and_observes_its_phases() -> None:
    registry = prom.CollectorRegistry()
    exported = exporter.StepMetrics(registry, ranks=2)
    exported.observe(record(1))
    exported.observe(record(2))

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    assert value(metrics.TRAINER_STEP) == 2 and value(metrics.TRAINER_PUBLISHED_VERSION) == 2
    assert value(metrics.TRAINER_LOSS) == 0.5 and value(metrics.TRAINER_CLIP_FRACTION) == 0.2
    assert (
        value(metrics.TRAINER_KL, to="reference") == 0.01
        and value(metrics.TRAINER_KL, to="behaviour") == 0.03
    )
    assert value(metrics.TRAINER_PUBLISHED_BYTES_TOTAL) == 2000
    assert value(metrics.TRAINER_ENTROPY) == 2.5 and value(metrics.TRAINER_GRAD_NORM) == 0.75
    assert value(metrics.TRAINER_TOKENS_PER_SECOND) == 200 and value(metrics.TRAINER_RANKS) == 2
    phases = metrics.TRAINER_PHASE_SECONDS + "_count"
    assert value(phases, phase="train") == 2 and value(phases, phase="batch_wait") == 2
    # Step 1 had no fence before it: its swap time is not a weight sync.
    assert value(phases, phase="weight_sync") == 1
    assert value(metrics.TRAINER_PHASE_SECONDS + "_sum", phase="weight_sync") == 0.3
