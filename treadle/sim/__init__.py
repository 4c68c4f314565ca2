"""Discrete-event rollout simulator driving the same ``treadle.policy`` code as the live services.

One entry: ``simulate`` reads any scenario file and dispatches on its ``kind:`` to a module of
``kinds`` (``rollart``, ``heddle``, ``flexmarl``, ``darts``), which validates the file's body and runs it;
``cli`` is ``treadle simulate`` over it, and ``bench/sim_*.py`` call the same kinds.

The simulators share ``entities`` (trajectories, groups, continuous-batching workers), ``events``
(kinds and the ``(time, kind order, sequence)`` queue), ``cost`` (engine, training, reward and
weight-sync durations over ``treadle.policy.costmodel``) and ``workloads`` (seeded generators with
sourced distributions). ``engine`` is the RolloutJob simulator (``scenario`` and ``systems`` turn a
scenario into runs, ``layout`` the job into pools, workers and tasks, ``placer`` places turns,
``trainer`` forms batches and commits versions, ``metrics`` is its ``Result``). Beside it on the
same worker and cost model: ``heddle`` (one synchronous rollout step per system, Heddle's
mechanisms and its baselines), ``flexmarl`` (multi-agent steps with FlexMARL's pipeline and load
balancing) and ``darts`` (synchronous GRPO steps over a learning length policy, DARTS against verl
and Tail Batching). Everything it reports is simulated.
"""
