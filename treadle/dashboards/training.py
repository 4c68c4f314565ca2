"""The training-step, inference-pool, environment/reward and weight dashboards.

Series of a job's pods carry ``pool`` (an inference pod's pool) and ``component`` besides
``namespace`` and ``job`` (the chart's scrape configuration sets them from the pod's labels), so
per-pool panels group vLLM's own series, which know no pool, by the pod they came from.
"""

from __future__ import annotations

from treadle import metrics as m
from treadle.dashboards.model import Dashboard, mean, panel, quantile, rate, total

_GENERATED = f"{m.VLLM_GENERATION_TOKENS}_total"
_PROMPT = f"{m.VLLM_PROMPT_TOKENS}_total"
_OLDEST_SERVED = f'min({m.PLACEMENT_POOL_WEIGHT_VERSION}{{stat="min"}})'

TRAINING = Dashboard(
    uid="treadle-training",
    title="Treadle / Training step",
    panels=(
        panel(
            "Trainer step and policy version",
            (f"max({m.TRAINER_STEP})", "step"),
            (f"max({m.SCHED_POLICY_VERSION})", "policy version served"),
            unit="none",
        ),
        panel("Loss of the last step", (f"max({m.TRAINER_LOSS})", "loss"), unit="none"),
        panel(
            "Mean reward of completed trajectories, by task",
            (mean(m.SCHED_TRAJECTORY_REWARD, "task"), "{{task}}"),
            (f"max({m.TRAINER_MEAN_REWARD})", "trainer batch"),
            unit="none",
        ),
        panel(
            "KL of the last step, to the reference and to the sampler", (total(m.TRAINER_KL, "to"), "{{to}}")
        ),
        panel(
            "Clip fraction of the last step",
            (f"max({m.TRAINER_CLIP_FRACTION})", "clipped"),
            unit="percentunit",
        ),
        panel(
            "Entropy and gradient norm of the last step",
            (f"max({m.TRAINER_ENTROPY})", "entropy"),
            (f"max({m.TRAINER_GRAD_NORM})", "gradient norm"),
            unit="none",
        ),
        panel(
            "Trainer throughput (tokens per second of training, all ranks) and ranks",
            (f"max({m.TRAINER_TOKENS_PER_SECOND})", "tokens/s"),
            (f"max({m.TRAINER_RANKS})", "ranks"),
            unit="none",
        ),
        panel(
            "Step time split: rollout stages (mean seconds per call) and weight sync (per step)",
            (mean(m.SCHED_STAGE_SECONDS, "stage"), "{{stage}}"),
            (mean(m.TRAINER_PHASE_SECONDS, where='phase="weight_sync"'), "weight sync"),
            unit="s",
        ),
        panel(
            "Trainer seconds per step, by phase",
            (mean(m.TRAINER_PHASE_SECONDS, "phase"), "{{phase}}"),
            unit="s",
        ),
        panel(
            "Staleness of trained batches (versions)",
            (f"max({m.TRAINER_STALENESS})", "last batch, largest"),
            (quantile(0.99, m.BUFFER_STALENESS), "delivered p99"),
            unit="none",
        ),
        panel(
            "Finished trajectories per second, by task and status",
            (rate(m.SCHED_TRAJECTORIES_TOTAL, "task, status"), "{{task}} {{status}}"),
            unit="ops",
        ),
    ),
)

POOLS = Dashboard(
    uid="treadle-pools",
    title="Treadle / Inference pools",
    panels=(
        panel("Running requests, by pool", (total(m.VLLM_NUM_REQUESTS_RUNNING, "pool"), "{{pool}}")),
        panel("Waiting requests, by pool", (total(m.VLLM_NUM_REQUESTS_WAITING, "pool"), "{{pool}}")),
        panel(
            "KV-cache usage, by pool (mean over replicas)",
            (f"avg by (pool) ({m.VLLM_KV_CACHE_USAGE_PERC})", "{{pool}}"),
            unit="percentunit",
        ),
        panel(
            "Tokens per second, by pool: prefill and decode",
            (rate(_PROMPT, "pool"), "{{pool}} prefill"),
            (rate(_GENERATED, "pool"), "{{pool}} decode"),
            unit="ops",
        ),
        panel(
            "Prefill share of the tokens processed, by pool",
            (f"{rate(_PROMPT, 'pool')} / ({rate(_PROMPT, 'pool')} + {rate(_GENERATED, 'pool')})", "{{pool}}"),
            unit="percentunit",
        ),
        panel(
            "Trajectories generating at the agents, by pool", (total(m.AGENT_INFLIGHT, "pool"), "{{pool}}")
        ),
        panel(
            "Placement: turns assigned per second, by pool and reason",
            (rate(m.PLACEMENT_ASSIGNMENTS_TOTAL, "pool, reason"), "{{pool}} {{reason}}"),
            unit="ops",
        ),
        panel(
            "Placement: trajectories migrated per second",
            (rate(m.PLACEMENT_MIGRATIONS_TOTAL), "migrated"),
            unit="ops",
        ),
        panel("Outstanding turns per worker", (total(m.PLACEMENT_OUTSTANDING, "worker"), "{{worker}}")),
    ),
)

ENVIRONMENTS = Dashboard(
    uid="treadle-environments",
    title="Treadle / Environments and rewards",
    panels=(
        panel("Environment sessions open, by env", (total(m.ENV_SESSIONS_ACTIVE, "env"), "{{env}}")),
        panel(
            "Environment sessions opened per second, by env",
            (rate(m.ENV_SESSIONS_OPENED_TOTAL, "env"), "{{env}}"),
            unit="ops",
        ),
        panel(
            "Action (environment step) latency, by env",
            *(
                (quantile(q, m.ENV_STEP_SECONDS, "env"), f"{{{{env}}}} p{round(q * 100)}")
                for q in (0.5, 0.9, 0.99)
            ),
            unit="s",
        ),
        panel(
            "Environment call failures per second, by call (seen by the scheduler)",
            (rate(m.SCHED_ENV_FAILURES_TOTAL, "call"), "{{call}}"),
            unit="ops",
        ),
        panel(
            "Environment servers sessions open on (seen by the scheduler)",
            (f"max({m.SCHED_ENV_SERVERS})", "servers"),
            unit="none",
        ),
        panel(
            "Reward latency seconds",
            *(
                (quantile(q, m.REWARD_LATENCY_SECONDS, "reward_fn"), f"{{{{reward_fn}}}} p{round(q * 100)}")
                for q in (0.5, 0.99)
            ),
            (quantile(0.99, m.SCHED_REWARD_SECONDS), "seen by the scheduler p99"),
            unit="s",
        ),
        panel(
            "Reward requests per second, by function and outcome",
            (rate(m.REWARD_REQUESTS_TOTAL, "reward_fn, outcome"), "{{reward_fn}} {{outcome}}"),
            unit="ops",
        ),
        panel("Rewards computing", (total(m.REWARD_INFLIGHT), "in flight")),
    ),
)

WEIGHTS = Dashboard(
    uid="treadle-weights",
    title="Treadle / Weights",
    panels=(
        panel(
            "Publish seconds per version (trainer to the weight store)",
            (mean(m.TRAINER_PHASE_SECONDS, where='phase="publish"'), "mean"),
            (quantile(0.99, m.TRAINER_PHASE_SECONDS, where='phase="publish"'), "p99"),
            unit="s",
        ),
        panel("Bytes published per second", (rate(m.TRAINER_PUBLISHED_BYTES_TOTAL), "published"), unit="Bps"),
        panel(
            "Exposed swap seconds per worker (paused), by pool and how the version got there",
            (quantile(0.5, m.PLACEMENT_WEIGHT_SWAP_SECONDS, "pool, pull"), "{{pool}} {{pull}} p50"),
            (quantile(0.99, m.PLACEMENT_WEIGHT_SWAP_SECONDS, "pool, pull"), "{{pool}} {{pull}} p99"),
            unit="s",
        ),
        panel(
            "Weight sync per step: suspend, swap, commit, resume (trainer)",
            (mean(m.TRAINER_PHASE_SECONDS, where='phase="weight_sync"'), "mean"),
            unit="s",
        ),
        panel(
            "Versions: published, committed, and served per pool (lowest, highest, target)",
            (f"max({m.TRAINER_PUBLISHED_VERSION})", "published"),
            (f"max({m.SCHED_POLICY_VERSION})", "committed"),
            (f"max by (pool, stat) ({m.PLACEMENT_POOL_WEIGHT_VERSION})", "{{pool}} {{stat}}"),
            unit="none",
        ),
        panel(
            "Versions alive: newest published to oldest served",
            (
                f"max({m.TRAINER_PUBLISHED_VERSION}) - {_OLDEST_SERVED} + 1",
                "versions",
            ),
            unit="none",
        ),
    ),
)

ALL = (TRAINING, POOLS, ENVIRONMENTS, WEIGHTS)
