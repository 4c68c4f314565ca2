"""The reference trainer's Prometheus metrics: one sample per step (``treadle.metrics``, trainer part).

``treadle.trainer.job`` serves them on the pod's ``metrics`` port; the Training-step and Weights
dashboards read them beside the scheduler's stage times.
"""

from __future__ import annotations

import prometheus_client as prom

from treadle import metrics
from treadle.trainer import loop

PHASE_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class StepMetrics:
    def __init__(self, registry: prom.CollectorRegistry, *, ranks: int = 1) -> None:
        def gauge(name: str, doc: str, labels: tuple[str, ...] = ()) -> prom.Gauge:
            return prom.Gauge(name, doc, labels, registry=registry)

        self.step = gauge(metrics.TRAINER_STEP, "Steps trained")
        self.loss = gauge(metrics.TRAINER_LOSS, "Loss of the last step")
        self.kl = gauge(
            metrics.TRAINER_KL, "Mean KL of the last step, to the reference or the sampler", ("to",)
        )
        self.clip = gauge(metrics.TRAINER_CLIP_FRACTION, "Share of the last step's tokens clipped")
        self.reward = gauge(metrics.TRAINER_MEAN_REWARD, "Mean reward of the last step's batch")
        self.staleness = gauge(metrics.TRAINER_STALENESS, "Largest staleness in the last step's batch")
        self.version = gauge(metrics.TRAINER_PUBLISHED_VERSION, "Weight version the last step published")
        self.entropy = gauge(metrics.TRAINER_ENTROPY, "Mean policy entropy at the last step's output tokens")
        self.grad_norm = gauge(
            metrics.TRAINER_GRAD_NORM, "Global gradient norm of the last step, before clipping"
        )
        self.tokens_per_s = gauge(
            metrics.TRAINER_TOKENS_PER_SECOND,
            "Tokens the last step trained on per second of training, all ranks",
        )
        self.ranks = gauge(metrics.TRAINER_RANKS, "Ranks of the trainer group")
        self.phase = prom.Histogram(
            metrics.TRAINER_PHASE_SECONDS, "Seconds per step, by phase", ["phase"], registry=registry,
            buckets=PHASE_BUCKETS,
        )  # fmt: skip
        self.bytes = prom.Counter(
            metrics.TRAINER_PUBLISHED_BYTES_TOTAL, "Bytes of weights published", registry=registry
        )
        self.ranks.set(ranks)

    def observe(self, r: loop.StepRecord) -> None:
        self.step.set(r.step)
        self.loss.set(r.stats.loss)
        self.kl.labels("reference").set(r.stats.kl)
        self.kl.labels("behaviour").set(r.stats.behaviour_kl)
        self.clip.set(r.stats.clip_fraction)
        self.reward.set(r.mean_reward)
        self.staleness.set(r.staleness)
        self.version.set(r.published)
        self.entropy.set(r.entropy)
        self.grad_norm.set(r.grad_norm)
        self.tokens_per_s.set(r.trained_tokens / r.train_s if r.train_s > 0 else 0.0)
        # The first step has no fence before it (nothing published yet): no weight_sync sample.
        phases = {"batch_wait": r.wait_s, "train": r.train_s, "publish": r.publish_s}
        if r.step > 1:
            phases["weight_sync"] = r.swap_s
        for phase, seconds in phases.items():
            self.phase.labels(phase).observe(seconds)
        self.bytes.inc(r.published_bytes)
