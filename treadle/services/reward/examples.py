"""Example user reward functions, loadable as ``py:treadle.services.reward.examples:<name>``.

They show the signature the gateway calls (keyword arguments response, reference, prompt, metadata;
return a float or (float, details); sync or async) and serve the gateway's tests.
"""

from __future__ import annotations

from typing import Any


def length_penalty(
    *, response: str, reference: str | None, prompt: str | None, metadata: dict[str, Any]
) -> float:
    """1.0 for an empty response, falling linearly to 0.0 at ``metadata.max_chars`` (default 1000)."""
    limit = int(metadata.get("max_chars", 1000))
    return max(0.0, 1.0 - len(response) / limit)


async def contains_reference(
    *, response: str, reference: str | None, prompt: str | None, metadata: dict[str, Any]
) -> tuple[float, dict[str, Any]]:
    """1.0 when the reference occurs in the response (async, with details)."""
    hit = reference is not None and reference != "" and reference in response
    return (1.0 if hit else 0.0), {"contains": hit}
