"""Discrete-event rollout simulator driving the same ``treadle.policy`` code as the live services.

Five parts kept apart (STYLE.md §5): ``entities`` (trajectories, groups, continuous-batching
workers), ``events`` (kinds and the ``(time, kind order, sequence)`` queue), ``cost`` (engine,
training, reward and weight-sync durations over ``treadle.policy.costmodel``), ``workloads``
(seeded trajectory generators with sourced distributions) and ``metrics`` (the ``Result``).
``engine`` runs them; ``scenario`` and ``systems`` turn a scenario file (a RolloutJob plus
simulation settings) into runs; ``cli`` is ``treadle simulate``. Two paper-specific runners sit
beside the engine on the same worker and cost model: ``heddle`` (one synchronous rollout step per
system, Heddle's mechanisms and its baselines) and ``flexmarl`` (multi-agent steps with FlexMARL's
pipeline and load balancing). Everything it reports is simulated.
"""
