"""The external-resources dashboard (ARL-Tangram): actions per resource type, split as the paper's
Table 1 splits an action's completion time, and the reward gateway's reward-model GPUs.

``resource`` is ``cpu`` (sandboxed runs in env and reward pods), ``gpu`` (reward-model gradings) or
``api:<tool>`` (a quota'd tool call).
"""

from __future__ import annotations

from treadle import metrics as m
from treadle.dashboards.model import Dashboard, mean, panel, quantile, rate, total

TANGRAM = Dashboard(
    uid="treadle-tangram",
    title="Treadle / External resources (ARL-Tangram)",
    panels=(
        panel(
            "Actions per second, by resource",
            (
                rate(f"{m.TANGRAM_ACTION_SECONDS}_count", "resource", where='phase="execution"'),
                "{{resource}}",
            ),
            unit="ops",
        ),
        panel(
            "Mean seconds per action: queue / execution / overhead, by resource",
            (mean(m.TANGRAM_ACTION_SECONDS, "resource, phase"), "{{resource}} {{phase}}"),
            unit="s",
        ),
        panel(
            "Queue p99 seconds, by resource",
            (quantile(0.99, m.TANGRAM_ACTION_SECONDS, "resource", where='phase="queue"'), "{{resource}}"),
            unit="s",
        ),
        panel(
            "Actions waiting for a grant, by resource", (total(m.TANGRAM_QUEUED, "resource"), "{{resource}}")
        ),
        panel(
            "Units granted per second (cores, GPUs, quota slots), by resource",
            (rate(m.TANGRAM_GRANTED_UNITS_TOTAL, "resource"), "{{resource}}"),
        ),
        panel("Reward-model GPUs serving an action", (total(m.REWARD_MODEL_GPUS_BUSY), "busy")),
        panel(
            "Reward-model restores and evictions per second, by model",
            (rate(m.REWARD_MODEL_RESTORES_TOTAL, "model"), "{{model}} restores"),
            (rate(m.REWARD_MODEL_EVICTIONS_TOTAL, "model"), "{{model}} evictions"),
            unit="ops",
        ),
        panel(
            "Restore seconds from host memory, by model",
            (mean(m.REWARD_MODEL_RESTORE_SECONDS, "model"), "{{model}} mean"),
            (quantile(0.99, m.REWARD_MODEL_RESTORE_SECONDS, "model"), "{{model}} p99"),
            unit="s",
        ),
    ),
)
