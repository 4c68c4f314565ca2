"""User code named ``py:<module>:<attribute>``, imported only under module prefixes the server allows.

Used by the reward gateway (``py:<module>:<function>``, ``treadle.services.reward.functions``) and the
env service (``py:<module>:<Class>``, ``treadle.services.env.service``). The name arrives in a
request, so the prefix check keeps a caller from importing arbitrary modules into the server.
"""

from __future__ import annotations

import importlib
from typing import Any

from treadle import errors
from treadle.api import v1alpha1

PREFIX = v1alpha1.USER_CODE


def load(name: str, prefixes: tuple[str, ...], *, what: str, field: str) -> Any:
    """The attribute ``name`` (``py:module:attribute``) names; ``SpecError`` naming ``field`` otherwise."""
    module_name, _, attribute = name.removeprefix(PREFIX).partition(":")
    if not attribute or not any(module_name == p or module_name.startswith(p + ".") for p in prefixes):
        raise errors.SpecError(
            f"{what} {name!r} is not under an allowed module prefix {list(prefixes)}", field=field
        )
    try:
        return getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise errors.SpecError(f"cannot import {name!r}: {exc}", field=field) from exc
