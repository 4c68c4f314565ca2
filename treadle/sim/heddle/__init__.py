"""Heddle reproduction: one synchronous rollout step of a long-tailed agentic batch, per system.

Called by the ``heddle`` scenario kind (``treadle simulate``, ``bench/sim_heddle.py``) and tests.
Heddle (arXiv 2603.28101) measures rollout throughput of one synchronous batch: every trajectory
starts at t=0 and the step ends with the slowest; so this runner simulates exactly that, on the
simulator's continuous-batching ``entities.Worker`` over the roofline ``cost.Roofline`` (the same
engine model as ``treadle.sim.engine``), and drives the same ``treadle.policy.heddle`` code the live
services call:

* ``predictor.HistoryModel`` (learned from a previous epoch of the same prompts, re-learned as
  trajectories finish) re-run at every step boundary; ``predictor.accuracy`` scores it;
* ``priority`` (LPT order and Algorithm 1's preemption rounds) on every worker;
* ``presorted_dp.plan`` with short-trajectory merging at dispatch, ``router`` for every step
  request, ``router.on_step`` -> ``migration.decide`` during tool calls, ``migration.schedule_epoch``
  for transfers (``kv-transfer`` cost: ``costmodel.kv_migration_time``);
* ``tp_planner.plan`` for the adaptive TP degrees (Heddle's resource manager);
* ``baselines`` for round-robin / FCFS / Autellix scheduling and static / cache-aware / least-load
  placement.

Not modelled (the report says so): the predictor's own GPU; KV eviction of preempted sequences
(a preempted sequence resumes without re-prefill); the cost of switching TP between steps (the
planner runs between steps, amortised, as in the paper). Everything it reports is simulated.

The package: ``workload`` (domains, drawn trajectory shapes), ``systems`` (the systems compared, a
step's configuration and result), ``step`` (the step simulation). The names below are re-exported
so callers write ``heddle.run(heddle.StepConfig(...), [heddle.HEDDLE])``.
"""

from treadle.sim.heddle.step import StepSim, degree_profile, run
from treadle.sim.heddle.systems import (
    HEDDLE,
    LIVE_MIRROR,
    SYSTEMS,
    Placement,
    Predictions,
    StepConfig,
    StepResult,
    System,
)
from treadle.sim.heddle.workload import Domain, Shape, draw_batch, parse_domain

__all__ = [
    "HEDDLE",
    "LIVE_MIRROR",
    "SYSTEMS",
    "Domain",
    "Placement",
    "Predictions",
    "Shape",
    "StepConfig",
    "StepResult",
    "StepSim",
    "System",
    "degree_profile",
    "draw_batch",
    "parse_domain",
    "run",
]
