"""FlexMARL (arXiv 2602.09578): multi-agent rollout load balancing and the micro-batch pipeline.

Pure policy code, called by the placement service (inter-agent rebalancing), the buffer service
(micro-batch release) and the simulator:

* ``sampling``: dependency-driven parallel sampling across queries, samples and agents (§5.1);
* ``load_balance``: intra-agent least-loaded dispatch with timeouts, inter-agent rebalancing (§5.2);
* ``pipeline``: per-agent micro-batch release and the unified update of all agents (§4.3).
"""
