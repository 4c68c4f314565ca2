"""ARL-Tangram (arXiv 2603.13019): action-level elastic management of external resources.

Pure policy code (no I/O, no clock, no global RNG), used unchanged by the simulator
(``treadle.sim.tangram``) and, later, by the live action manager:

* ``model``: the unified action model (§4.1): resource types, cost vectors of feasible sets, the
  key elasticity resource and ``getDur(m) = T / (E(m) m)`` (Eq. 1);
* ``profile``: duration profiles: historical averages and elasticity fitted from samples;
* ``buddy``: the GPU pool's aligned 1/2/4/8 chunks, cache affinity, LRU and merged buddies (§5.3);
* ``pools``: the managers' topology (flat units, GPU chunks) as Alg. 1 and Alg. 3 see it;
* ``dparrange``: Alg. 3 (topology-agnostic DPArrange) with the flat operator and Alg. 4;
* ``schedule``: Alg. 1 (FCFS admission + greedy eviction) and Alg. 2 (ACT approximation);
* ``cores``: the CPU manager's node placement and NUMA-aware core sets (§5.2).

The fixes to the printed pseudocode follow the digest's §0 (bugs #2-#8); each is named where it
is applied.
"""
