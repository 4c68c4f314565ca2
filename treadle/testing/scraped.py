"""A process's Prometheus metrics as tests read them: samples by name and labels, summed on demand."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import parser
from prometheus_client.metrics_core import Metric

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
"""(sample name, sorted labels) -> value."""


def samples(families: Iterable[Metric]) -> Samples:
    """The samples of ``families`` (a registry's ``collect()``, or ``parse``'s)."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for family in families for s in family.samples}


def parse(text: str) -> Samples:
    """The samples of a ``/metrics`` page."""
    return samples(parser.text_string_to_metric_families(text))


def value(scraped: Samples, name: str, **labels: str) -> float:
    """Sum of ``name``'s samples (a counter's ``_total`` too) whose labels include ``labels``."""
    names = {name, f"{name}_total"}
    return sum(v for (n, ls), v in scraped.items() if n in names and set(labels.items()) <= set(ls))


def by_label(scraped: Samples, name: str, label: str) -> dict[str, float]:
    """``name``'s samples summed per value of ``label`` (samples without it under "")."""
    out: dict[str, float] = {}
    for (n, ls), v in scraped.items():
        if n in (name, f"{name}_total"):
            key = dict(ls).get(label, "")
            out[key] = out.get(key, 0.0) + v
    return out
