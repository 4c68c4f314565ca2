"""The scheduler: drives every trajectory's agent loop under staleness-bounded admission."""
