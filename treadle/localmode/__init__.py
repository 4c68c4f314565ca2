"""Local mode: ``treadle run FILE`` runs a whole RolloutJob on one machine, every service a process."""
