"""ARL-Tangram reproduction: action-level elastic management against trajectory- and task-level allocation.

Called by the ``tangram`` scenario kind (``treadle simulate``, ``bench/sim_tangram.py``) and tests.
One run is one rollout step: ``batch`` trajectories start together and each alternates LLM
generation (a delay: the policy GPUs are not modelled) with external actions, submitted as the
previous step ends (sequence-level asynchronous rollout, §6.1). The step ends with the last
trajectory. Two workloads, each against its paper baseline, a module each:

* ``coding`` (CPU): tool calls then a reward run, ARL-Tangram's CPU manager against a pod per
  trajectory (``k8s``) and against a fixed DoP per reward run (``fixed-dop=<n>``);
* ``mopd`` (GPU): a teacher forward per trajectory, the GPU manager over a buddy pool against a
  static TP deployment per teacher;

and ``common``: the actions, the event loop, the rollout, the probes and the result both use.
The names below are re-exported so callers write ``tangram.run_coding(tangram.Coding(...), "k8s")``.

Everything is simulated; the decision times are measured (wall clock around ``schedule.decide``).
"""

from treadle.sim.tangram.coding import CODING_SYSTEMS, FIXED_DOP, Coding, CpuTangram, run_coding
from treadle.sim.tangram.mopd import MOPD_SYSTEMS, Mopd, run_mopd

__all__ = [
    "CODING_SYSTEMS",
    "FIXED_DOP",
    "MOPD_SYSTEMS",
    "Coding",
    "CpuTangram",
    "Mopd",
    "run_coding",
    "run_mopd",
]
