"""The smallest valid RolloutJob spec, for the API tests that add one section to it."""

from __future__ import annotations

from typing import Any


def minimal(**extra: Any) -> dict[str, Any]:
    """One agent, one pool, one task, and ``extra``'s sections (camelCase, as stored)."""
    return {
        "agents": [{"name": "a", "model": "m"}],
        "pools": [{"name": "p", "agent": "a", "accelerator": "H20"}],
        "tasks": [{"name": "t", "agents": ["a"], "environment": "math-tool", "reward": "r"}],
        **extra,
    }
