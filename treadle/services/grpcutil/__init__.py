"""Shared gRPC plumbing for the scheduler, placement and buffer services and their clients.

``status`` maps ``treadle.errors`` to status codes (and back, for clients), ``server`` builds an
asyncio server with health checking, a request-id + error-mapping interceptor and bounded
concurrency. ``backpressure`` only aliases ``treadle.errors.Overloaded`` until its last importer moves.
"""
