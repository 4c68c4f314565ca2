"""Heddle (arXiv 2603.28101): trajectory-level scheduling, placement, migration and adaptive TP.

Pure policy code, called by the scheduler and placement services and by the simulator:

* ``predictor``: online remaining-length predictor learned from finished trajectories (§4.1);
* ``priority``: progressive priority (LPT on predicted remaining work) with preemption (§4.2);
* ``presorted_dp``: presorted partition of trajectories over workers, Eq. (2)-(3) (§5.1-5.2), with
  ``grouping``, a group's cost and its reach under a time bound, which its searches share;
* ``migration``: opportunistic migration during tool calls, its cost and transfer schedule (§5.3);
* ``router``: per-trajectory worker, prediction and rank, updated at every step boundary (§3);
* ``tp_planner``: sort-initialised simulated annealing over TP degrees -> a pool reshape (§6).
"""
