"""Pure diff of rendered children against observed ones: what to apply, what to delete.

Called by ``treadle.operator.reconcile``. A child is applied when it is missing or its
``treadle.dev/spec-hash`` annotation differs from the rendered one, so an update touches only the
children whose rendering changed; a child is deleted when the job no longer renders it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from treadle.operator.render import common as render_common


@dataclass(frozen=True)
class Plan:
    """What the reconciler must do, in order: apply (create or update), then delete."""

    apply: tuple[dict[str, Any], ...]
    delete: tuple[tuple[str, str], ...]
    """(kind, name) of observed children no longer rendered."""
    unchanged: int

    @property
    def empty(self) -> bool:
        return not self.apply and not self.delete


def plan(rendered: Sequence[dict[str, Any]], observed: Mapping[tuple[str, str], Mapping[str, Any]]) -> Plan:
    """Compare by (kind, name); ``observed`` holds only children owned by this job."""
    apply = []
    unchanged = 0
    for obj in rendered:
        have = observed.get(render_common.key(obj))
        want_hash = obj["metadata"]["annotations"][render_common.HASH_ANNOTATION]
        have_hash = (have or {}).get("metadata", {}).get("annotations", {}).get(render_common.HASH_ANNOTATION)
        if have is None or have_hash != want_hash:
            apply.append(obj)
        else:
            unchanged += 1
    wanted = {render_common.key(obj) for obj in rendered}
    delete = tuple(sorted(k for k in observed if k not in wanted))
    return Plan(apply=tuple(apply), delete=delete, unchanged=unchanged)
