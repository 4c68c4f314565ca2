"""The buffer (experience store): scored trajectories in, staleness-bounded whole-group batches out."""
