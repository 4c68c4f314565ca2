"""The backpressure error raised by service logic and mapped to RESOURCE_EXHAUSTED at the gRPC edge.

``treadle.errors`` has no "too much work queued" error yet, so the services that queue work (the
scheduler's pending groups) raise this one; it carries no gRPC import so ``service.py`` modules stay
framework-free.
"""

from __future__ import annotations

from treadle import errors


class Overloaded(errors.TreadleError):
    """The request is valid but the queue it would join is full; retry later."""
