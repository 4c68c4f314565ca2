"""The dashboards Treadle ships: rollout step metrics, multi-agent rebalancing and operator health;
``training`` holds the training-step, pool, environment and weight views, ``tangram`` the external
resources (ARL-Tangram)."""

from __future__ import annotations

from treadle import metrics as m
from treadle.dashboards import tangram, training
from treadle.dashboards.model import Dashboard, mean, panel, quantile, rate, total

ROLLOUT = Dashboard(
    uid="treadle-rollout",
    title="Treadle / Rollout",
    panels=(
        panel(
            "Finished trajectories per second, by status",
            (rate(m.SCHED_TRAJECTORIES_TOTAL, "status"), "{{status}}"),
            unit="ops",
        ),
        panel(
            "Trajectories in flight / waiting for admission",
            (m.SCHED_INFLIGHT, "in flight"),
            (m.SCHED_PENDING, "waiting"),
        ),
        panel(
            "Step time split: mean seconds per call, by stage",
            (mean(m.SCHED_STAGE_SECONDS, "stage"), "{{stage}}"),
            unit="s",
        ),
        panel("Stage p99 seconds", (quantile(0.99, m.SCHED_STAGE_SECONDS, "stage"), "{{stage}}"), unit="s"),
        panel("Turns per second, by task", (rate(m.SCHED_TURNS_TOTAL, "task"), "{{task}}"), unit="ops"),
        panel(
            "Heddle: preemptions and migrations per second",
            (rate(m.SCHED_PREEMPTIONS_TOTAL), "preempted turns"),
            (rate(m.PLACEMENT_MIGRATIONS_TOTAL), "migrated trajectories"),
            unit="ops",
        ),
        panel(
            "DARTS: candidates per second (started, selected, unselected, aborted by reason)",
            (rate(m.SCHED_DARTS_CANDIDATES_TOTAL), "started"),
            (rate(m.SCHED_DARTS_SELECTED_TOTAL), "selected"),
            (rate(m.SCHED_DARTS_UNSELECTED_TOTAL), "completed, not selected"),
            (rate(m.SCHED_DARTS_ABORTED_TOTAL, "reason"), "aborted: {{reason}}"),
            unit="ops",
        ),
        panel(
            "DARTS: total budget of the last step, by task", (total(m.SCHED_DARTS_BUDGET, "task"), "{{task}}")
        ),
        panel("Policy version served", (f"max({m.SCHED_POLICY_VERSION})", "version"), unit="none"),
        panel(
            "Staleness of delivered trajectories (versions)",
            (quantile(0.5, m.BUFFER_STALENESS), "p50"),
            (quantile(0.99, m.BUFFER_STALENESS), "p99"),
            unit="none",
        ),
        panel("Buffer: trajectories stored", (total(m.BUFFER_STORED), "stored")),
        panel(
            "Buffer: put / delivered / evicted per second",
            (rate(m.BUFFER_PUT_TOTAL, "status"), "put {{status}}"),
            (rate(m.BUFFER_DELIVERED_TOTAL), "delivered"),
            (rate(m.BUFFER_EVICTED_TOTAL), "evicted stale"),
            unit="ops",
        ),
        panel("Environment sessions open, by env", (total(m.ENV_SESSIONS_ACTIVE, "env"), "{{env}}")),
        panel(
            "Environment step p99 seconds, by env",
            (quantile(0.99, m.ENV_STEP_SECONDS, "env"), "{{env}}"),
            unit="s",
        ),
        panel(
            "Environment call failures per second, by call",
            (rate(m.SCHED_ENV_FAILURES_TOTAL, "call"), "{{call}}"),
            unit="ops",
        ),
        panel(
            "Reward latency seconds",
            (quantile(0.5, m.REWARD_LATENCY_SECONDS), "gateway p50"),
            (quantile(0.99, m.SCHED_REWARD_SECONDS), "seen by scheduler p99"),
            unit="s",
        ),
        panel(
            "Reward requests per second, by function and outcome",
            (rate(m.REWARD_REQUESTS_TOTAL, "reward_fn, outcome"), "{{reward_fn}} {{outcome}}"),
            unit="ops",
        ),
        panel(
            "Placement: turns assigned per second, by pool and reason",
            (rate(m.PLACEMENT_ASSIGNMENTS_TOTAL, "pool, reason"), "{{pool}} {{reason}}"),
            unit="ops",
        ),
        panel("Outstanding turns per worker", (total(m.PLACEMENT_OUTSTANDING, "worker"), "{{worker}}")),
        panel(
            "Generated tokens per second (agents)",
            (rate(m.AGENT_GENERATED_TOKENS_TOTAL), "tokens/s"),
            unit="ops",
        ),
        panel(
            "Agent overhead outside the engine, seconds",
            (quantile(0.5, m.AGENT_OVERHEAD_SECONDS), "p50"),
            (quantile(0.99, m.AGENT_OVERHEAD_SECONDS), "p99"),
            unit="s",
        ),
        panel(
            "Engine requests",
            (total(m.VLLM_NUM_REQUESTS_RUNNING), "running"),
            (total(m.VLLM_NUM_REQUESTS_WAITING), "waiting"),
        ),
        panel(
            "Engine KV-cache usage", (f"avg({m.VLLM_KV_CACHE_USAGE_PERC})", "kv usage"), unit="percentunit"
        ),
    ),
)

# Apart from ROLLOUT: a single-agent job never rebalances, so these panels would stay empty there.
MULTI_AGENT = Dashboard(
    uid="treadle-multi-agent",
    title="Treadle / Multi-agent (FlexMARL)",
    panels=(
        panel(
            "Queued turns per agent (assigned, not yet running), at placement's last rebalance poll",
            (total(m.PLACEMENT_AGENT_QUEUE, "agent"), "{{agent}}"),
        ),
        panel(
            "Workers moved between agents since placement started, by donor and receiver",
            (total(m.PLACEMENT_REBALANCE_MOVES_TOTAL, "donor, receiver"), "{{donor}} -> {{receiver}}"),
            unit="none",
        ),
    ),
)

# The operator's own series carry no job; its per-job ones name it in ``name`` (and ``namespace``).
_OPERATOR_JOB = 'namespace=~"$namespace", name=~"$job"'

OPERATOR = Dashboard(
    uid="treadle-operator",
    title="Treadle / Operator",
    matcher="",
    variable_metric=m.OPERATOR_JOB_INFO,
    job_label="name",
    panels=(
        panel(
            "Reconciles per second, by result",
            (rate(m.OPERATOR_RECONCILE_TOTAL, "result"), "{{result}}"),
            unit="ops",
        ),
        panel(
            "Reconcile seconds",
            (quantile(0.5, m.OPERATOR_RECONCILE_SECONDS), "p50"),
            (quantile(0.99, m.OPERATOR_RECONCILE_SECONDS), "p99"),
            unit="s",
        ),
        panel(
            "Reconciles running / jobs pending",
            (total(m.OPERATOR_RECONCILE_INFLIGHT), "running"),
            (total(m.OPERATOR_JOBS_PENDING), "pending"),
        ),
        panel(
            "RolloutJobs by phase",
            (f"count by (phase) ({m.OPERATOR_JOB_INFO}{{{_OPERATOR_JOB}}})", "{{phase}}"),
        ),
        panel(
            "Job conditions, by condition and reason",
            (
                total(m.OPERATOR_JOB_CONDITION, "condition, reason", where=_OPERATOR_JOB),
                "{{condition}} {{reason}}",
            ),
        ),
        panel(
            "Pool replicas by state",
            (total(m.OPERATOR_POOL_REPLICAS, "pool, state", where=_OPERATOR_JOB), "{{pool}} {{state}}"),
        ),
        panel(
            "Children applied per second, by kind and action",
            (rate(m.OPERATOR_CHILDREN_APPLIED_TOTAL, "kind, action"), "{{kind}} {{action}}"),
            unit="ops",
        ),
    ),
)

ALL: tuple[Dashboard, ...] = (
    ROLLOUT, *training.ALL, tangram.TANGRAM, MULTI_AGENT, OPERATOR,
)  # fmt: skip
