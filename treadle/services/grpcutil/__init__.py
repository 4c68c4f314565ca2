"""Shared gRPC plumbing for the scheduler, placement and buffer services and their clients.

``status`` maps ``treadle.errors`` to status codes (and back, for clients), ``server`` builds an
asyncio server with health checking, a request-id + error-mapping interceptor and bounded
concurrency. Backpressure is ``treadle.errors.Overloaded`` (RESOURCE_EXHAUSTED on the wire).
"""
