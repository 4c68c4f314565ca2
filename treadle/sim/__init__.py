"""Discrete-event rollout simulator driving the same ``treadle.policy`` code as the live services."""
