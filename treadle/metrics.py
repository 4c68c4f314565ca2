"""Every Prometheus metric name Treadle exports, in one place.

Services, the operator and the Grafana dashboards all take names from here; a test checks that
each dashboard query names only metrics defined in this module. Each component builds its
collectors on its own ``CollectorRegistry`` (never the global default) so tests can run many.
Sections below belong to one component each.
"""

from __future__ import annotations

PREFIX = "treadle"
