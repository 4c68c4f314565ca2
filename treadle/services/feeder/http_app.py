"""Routes of the feeder: ``/healthz`` (ready once positions are restored from Redis), ``/metrics``,
and ``GET /v1/feeds`` (per task: epoch, offset, rows, rows fed, done). Built by ``__main__`` and tests."""

from __future__ import annotations

import fastapi
import prometheus_client

from treadle.services.feeder import service
from treadle.services.httputil import app as http_app


def build_app(
    svc: service.FeederService, registry: prometheus_client.CollectorRegistry, *, token: str | None = None
) -> fastapi.FastAPI:
    """``token``: the job's, required of every caller but the probes and Prometheus (``treadle.auth``)."""
    app = http_app.new_app(title="treadle feeder", registry=registry, ready=lambda: svc.restored, token=token)

    @app.get("/v1/feeds", tags=["feeder"])
    async def feeds() -> list[dict[str, object]]:
        return svc.status()

    return app
