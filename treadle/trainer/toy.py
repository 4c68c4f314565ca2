"""The toy verifiable task: write as many of one target character as possible.

A RolloutJob names the same scoring as the gateway's built-in ``letter-fraction`` with the target
letter as each row's reference answer. Used three ways here: ``score`` is the reward gateway's user function
(``py:treadle.trainer.toy:score``, gateway started with ``--allow-user-module treadle.trainer``),
``reward`` scores text in the in-process run, and ``PROMPT`` is what that run asks.

Why this task: a tiny random Llama must show a learning signal within about 20 GRPO steps on 2 CPU
cores. The reward is shaped (the fraction of the answer's characters equal to ``TARGET``, so every
sample in a group scores differently and the group-relative advantage is rarely zero) and
verifiable from the text alone. A random policy scores a few percent; the best answer (only
``TARGET``) scores 1.
"""

from __future__ import annotations

from typing import Any

from treadle.services.reward import functions

TARGET = "a"
PROMPT = f"Answer with the letter {TARGET} as many times as you can."
REWARD = "py:treadle.trainer.toy:score"
"""``score`` as a RolloutJob's ``spec.tasks[].reward`` names it."""


def reward(text: str, target: str = TARGET) -> float:
    """Fraction of the characters of ``text`` equal to ``target`` (the gateway's ``letter-fraction``)."""
    return functions.letter_fraction(text, target)


def score(
    *, response: str, reference: str | None = None, prompt: str | None = None, metadata: Any = None
) -> tuple[float, dict[str, Any]]:
    """Reward-gateway entry point; the task's reference (if any) is not used: the target is fixed."""
    value = reward(response)
    return value, {"target": TARGET, "chars": len(response), "hits": response.count(TARGET)}
