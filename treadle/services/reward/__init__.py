"""Reward gateway: stateless scoring of finished trajectories (math, exact, code tests, LLM judge, user fns).

The operator runs it scale-to-zero; the scheduler calls it through ``RewardClient``.
Run: ``python -m treadle.services.reward --host 127.0.0.1 --port N``.
"""
