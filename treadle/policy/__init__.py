"""Pure scheduling and placement algorithms, shared by the live services and the simulator.

Nothing here does I/O, reads a clock or uses the global RNG: inputs are plain values and frozen
dataclasses defined in this package, outputs are decisions as data (``None`` means nothing to do).
Importing kopf, kubernetes, grpc, fastapi, redis or httpx here is forbidden (see .importlinter).
"""
