"""Placement: which inference worker runs a trajectory's next turn (affinity, then sticky least-loaded)."""
