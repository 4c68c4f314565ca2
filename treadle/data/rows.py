"""One dataset row as the feeder submits it and an environment receives it.

The feeder (``treadle.services.feeder``) puts ``Row.option()`` under ``options["row"]`` of the prompt
group it submits; the scheduler passes the options to the environment's factory, which reads them
back with ``from_option`` (errors name ``options.row.<key>``). ``docs/ENVIRONMENTS.md`` documents
the shape for user environments.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

from treadle import errors

OPTION = "row"
"""The key of the environment's open options that carries the row."""
ROW_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,79}$")
"""Row ids go into group ids (``<task>:e<epoch>:<row id>``), which the scheduler bounds in length and
characters."""


@dataclasses.dataclass(frozen=True)
class Row:
    row_id: str
    """Unique in the dataset: the ``idColumn`` value, or the row's index in the file."""
    prompt: str
    """The prompt text: the ``promptColumn`` value, or ``chatTemplate`` filled from the columns."""
    answer: str | None
    """The reference answer (``answerColumn``) handed to the reward; None without one."""
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """The row's other columns, as JSON values."""

    def option(self) -> dict[str, Any]:
        """The row as ``options["row"]`` carries it: ``{"id", "prompt", "answer"?, "extra"}``."""
        out: dict[str, Any] = {"id": self.row_id, "prompt": self.prompt, "extra": dict(self.extra)}
        if self.answer is not None:
            out["answer"] = self.answer
        return out


def from_option(options: Mapping[str, Any]) -> Row | None:
    """The row in an environment's open options, or None when the group came from a seed alone."""
    raw = options.get(OPTION)
    if raw is None:
        return None
    field = f"options.{OPTION}"
    if not isinstance(raw, Mapping):
        raise errors.SpecError("must be an object", field=field)
    for key in ("id", "prompt"):
        if not isinstance(raw.get(key), str):
            raise errors.SpecError(f"must be a string, got {raw.get(key)!r}", field=f"{field}.{key}")
    answer, extra = raw.get("answer"), raw.get("extra", {})
    if answer is not None and not isinstance(answer, str):
        raise errors.SpecError(f"must be a string, got {answer!r}", field=f"{field}.answer")
    if not isinstance(extra, Mapping):
        raise errors.SpecError("must be an object", field=f"{field}.extra")
    return Row(row_id=raw["id"], prompt=raw["prompt"], answer=answer, extra=dict(extra))
