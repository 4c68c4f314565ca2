"""Grafana dashboards as code: panels built from the metric names in ``treadle.metrics``.

``python -m treadle.dashboards`` writes the JSON models into ``charts/treadle/dashboards/``; unit
tests check the committed files are current and name only defined metrics, and an integration test
runs every panel query against a real Prometheus scraping real services.
"""
