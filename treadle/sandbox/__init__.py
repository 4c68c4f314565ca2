"""Sandboxed execution of untrusted Python (model-written code) for the env service and reward gateway."""
