"""Scenario kinds: what each simulator adds to the one scenario format, and what a kind provides.

Every scenario file has one envelope (``version: 1``, ``kind``, ``name``, ``description``) and a body
of its kind's own schema. A kind is a module here with ``parse(raw) -> Plan``: it checks the
envelope with ``envelope`` and its body itself, raising ``SpecError`` that names the field. A
``Plan`` runs under ``Options`` (the ``treadle simulate`` flags) and returns an ``Outcome``: a plain
text table, JSON-able results, and any plots. ``treadle.sim.simulate`` maps ``kind`` to the module.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from treadle import errors


@dataclasses.dataclass(frozen=True)
class Options:
    """How to run a plan (``treadle simulate`` flags); ``None`` and ``()`` keep the scenario's own."""

    runs: tuple[str, ...] = ()
    """Systems or variants to run, in this order (the kind says which names it knows)."""
    steps: int | None = None
    seed: int | None = None
    quick: bool = False
    """The smallest run of every part of the scenario's own path (each kind says what it shrinks):
    for tests and a first look, never for the figures a report quotes."""


class Outcome(Protocol):
    def table(self) -> str:
        """A plain-text table of every run, headed by a line that says it is simulated."""
        ...

    def summary(self) -> Any:
        """Plain data for ``results.json``."""
        ...

    def plot(self, out: Path) -> list[str]:
        """Write the kind's plots under ``out``; the file names written (none for some kinds)."""
        ...


class Plan(Protocol):
    """A parsed, validated scenario of one kind."""

    @property
    def name(self) -> str: ...

    @property
    def description(self) -> str: ...

    @property
    def runs(self) -> tuple[str, ...]:
        """The runs (systems or variants) the scenario asks for, in report order."""
        ...

    @property
    def body(self) -> Mapping[str, Any]:
        """The kind's part of the file (for ``config.json``)."""
        ...

    def run(self, options: Options) -> Outcome: ...


ENVELOPE = ("version", "kind", "name", "description")


def envelope(raw: Any, kind: str) -> Mapping[str, Any]:
    """``raw`` as a mapping, once its envelope is right for ``kind`` (a missing ``kind`` passes: the
    dispatcher chose this one)."""
    if not isinstance(raw, Mapping):
        raise errors.SpecError("a scenario is a mapping", field="scenario")
    if raw.get("version") != 1:
        raise errors.SpecError("only version 1 is known", field="version", value=raw.get("version"))
    if raw.get("kind", kind) != kind:
        raise errors.SpecError(f"this is a {kind} parser", field="kind", value=raw.get("kind"))
    if "name" not in raw:
        raise errors.SpecError("is required", field="name")
    return raw


def section(raw: Mapping[str, Any], key: str, required: tuple[str, ...]) -> Mapping[str, Any]:
    """``raw[key]``, a mapping holding every key of ``required``; the error names the missing field."""
    if key not in raw:
        raise errors.SpecError("is required", field=key)
    value = raw[key]
    if not isinstance(value, Mapping):
        raise errors.SpecError("must be a mapping", field=key)
    for name in required:
        if name not in value:
            raise errors.SpecError("is required", field=f"{key}.{name}")
    return value


def known(value: Any, table: Mapping[str, Any], field: str) -> str:
    """``value`` as a key of ``table`` (models, accelerators...); the error names ``field``."""
    if str(value) not in table:
        raise errors.SpecError(f"unknown {value!r}; known: {sorted(table)}", field=field, value=value)
    return str(value)


def body(raw: Mapping[str, Any]) -> dict[str, Any]:
    """Everything in ``raw`` but the envelope."""
    return {k: v for k, v in raw.items() if k not in ENVELOPE}


def table(header: str, cols: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """``header``, then the columns padded to their widest cell (``(no runs)`` without rows)."""
    if not rows:
        return f"{header}\n(no runs)"
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(cols)]
    lines = [header, "  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class Cells:
    """An ``Outcome`` of means per cell and run (``flexmarl``, ``darts``): one table row each."""

    scenario: str
    cells: Mapping[str, Mapping[str, Mapping[str, float]]]
    """Cell -> run (variant or system) -> metric -> mean."""
    metrics: tuple[str, ...]
    columns: tuple[str, str]
    """Headers of the cell and run columns."""
    note: str
    """What the figures are, after ``SIMULATED -- scenario NAME:``."""

    def table(self) -> str:
        rows = [
            [cell, run, *(f"{m[k]:,.2f}" for k in self.metrics)]
            for cell, by_run in self.cells.items()
            for run, m in by_run.items()
        ]
        return table(
            f"SIMULATED -- scenario {self.scenario}: {self.note}", [*self.columns, *self.metrics], rows
        )

    def summary(self) -> dict[str, Any]:
        return {"label": "simulated", "cells": self.cells}

    def plot(self, out: Path) -> list[str]:
        return []
