"""The one simulator entry: any scenario file in, its kind's plan out (``treadle simulate``, bench, tests).

One scenario format with a ``kind:`` discriminator, rather than a dispatcher that guesses the format
from the keys it finds: every file opens with the same envelope (``version: 1``, ``kind``, ``name``,
``description``), so a reader sees at once which simulator runs it, a file that mixes two schemas
is refused instead of matched by whichever test comes first, and a new kind cannot change how an
old file is read. A file without ``kind`` is ``rollart`` (the RolloutJob engine), the only format
before kinds existed. Each kind keeps its own body schema and its own errors naming the field.

Adding a kind (Tangram...): a module in ``treadle.sim.kinds`` with ``parse(raw) -> Plan``
(see ``treadle.sim.kinds``), one entry in ``KINDS``, and a scenario file under ``bench/scenarios/``
(``tests/unit/sim/test_simulate.py`` runs every file there).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from treadle import errors
from treadle.sim import kinds, scenario
from treadle.sim.kinds import darts, flexmarl, heddle, rollart, tangram

KINDS: Mapping[str, Callable[[Any], kinds.Plan]] = {
    rollart.NAME: rollart.parse,
    heddle.NAME: heddle.parse,
    flexmarl.NAME: flexmarl.parse,
    tangram.NAME: tangram.parse,
    darts.NAME: darts.parse,
}
"""Scenario kind -> its parser."""

DEFAULT_KIND = rollart.NAME


def parse(raw: Any) -> kinds.Plan:
    """The plan of a scenario mapping, by its ``kind``; ``SpecError`` names the bad field."""
    kind = raw.get("kind", DEFAULT_KIND) if isinstance(raw, Mapping) else DEFAULT_KIND
    if kind not in KINDS:
        raise errors.SpecError(f"unknown kind {kind!r}; known: {sorted(KINDS)}", field="kind", value=kind)
    return KINDS[kind](raw)


def load(path: str | Path) -> kinds.Plan:
    """The plan of the scenario file at ``path``."""
    return parse(scenario.read(path))
