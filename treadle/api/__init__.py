"""The RolloutJob API: typed models that are the one source of the CRD schema and of validation."""
