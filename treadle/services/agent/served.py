"""Whose weights a worker serves after a move, kept in a file that outlives the agent's container.

A rebalancing move ends with a resume naming the receiver's agent and pool; the agent tags turns with
that agent and registers with that pool from then on (``reporter.rehome``). Held only in the agent's
memory, that would die with its container: restarted alone while its engine keeps the receiver's
weights, the agent would register in the pod's rendered pool and tag turns with the donor. The
operator mounts an ``emptyDir`` into the agent container (it lives as long as the pod), and the agent
writes what it serves there after every resume and reads it at start, trusting it only while the
engine still shows the weight-version label it had then: an engine that restarted too serves the
rendered checkpoint again, for which the rendered agent and pool are right.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Served:
    agent: str
    pool: str
    label: str
    """The engine's weight-version label right after the resume that wrote this."""


def read(path: Path) -> Served | None:
    """What was last written to ``path``; ``None`` if nothing was, or it cannot be read."""
    try:
        raw = json.loads(path.read_text())
        return Served(agent=str(raw["agent"]), pool=str(raw["pool"]), label=str(raw["label"]))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("ignoring %s, which does not say what this worker serves: %s", path, exc)
        return None


def write(path: Path, served: Served) -> None:
    """Replace ``path`` atomically: a container killed mid-write leaves the previous record."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(dataclasses.asdict(served)))
    os.replace(tmp, path)
