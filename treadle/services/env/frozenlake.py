"""``frozenlake``: the multi-turn grid game as text (Gymnasium's FrozenLake rules, our own code).

The agent starts on S and must reach G without stepping into a hole H; each turn it answers with a
direction (``left``/``down``/``right``/``up``, optionally inside ``<action>...</action>``). The map is
drawn from the seed with a guaranteed path. Reward comes from the env: 1.0 on reaching G, else 0.0
when the episode ends; ``info["reward_fn"]`` is ``env`` (the gateway returns ``metadata.env_reward``).
With ``slippery`` the move goes sideways with probability 2/3, from the session's own seeded RNG.

Opening a session costs some 25 us (the map is drawn from the seed) and has no seed-independent part, so
the pod's warm pool (``spec.environment.warmPool``) pre-starts nothing for it.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping
from typing import Any

from treadle.services.env import base

MOVES = {"left": (0, -1), "down": (1, 0), "right": (0, 1), "up": (-1, 0)}
ORDER = ["left", "down", "right", "up"]
ACTION = re.compile(r"\b(left|down|right|up)\b", re.IGNORECASE)


def make_map(rng: random.Random, size: int, hole_p: float = 0.2) -> list[str]:
    """A size x size map with S at the top-left, G at the bottom-right and a path between them."""
    while True:
        grid = [["H" if rng.random() < hole_p else "F" for _ in range(size)] for _ in range(size)]
        grid[0][0], grid[-1][-1] = "S", "G"
        if _reachable(grid):
            return ["".join(row) for row in grid]


def _reachable(grid: list[list[str]]) -> bool:
    size, seen, todo = len(grid), {(0, 0)}, [(0, 0)]
    while todo:
        r, c = todo.pop()
        if grid[r][c] == "G":
            return True
        for dr, dc in MOVES.values():
            nr, nc = r + dr, c + dc
            if 0 <= nr < size and 0 <= nc < size and grid[nr][nc] != "H" and (nr, nc) not in seen:
                seen.add((nr, nc))
                todo.append((nr, nc))
    return False


class FrozenLake:
    def __init__(self, seed: int, *, size: int, max_turns: int, slippery: bool) -> None:
        self.rng = random.Random(seed)
        self.grid = make_map(self.rng, size)
        self.pos = (0, 0)
        self.max_turns, self.slippery, self.turns = max_turns, slippery, 0

    def render(self) -> str:
        rows = []
        for r, row in enumerate(self.grid):
            rows.append("".join("P" if (r, c) == self.pos else ch for c, ch in enumerate(row)))
        return "\n".join(rows)

    async def reset(self) -> tuple[str, dict[str, Any]]:
        text = (
            "You are P on a frozen lake. Reach G, avoid holes H; F is safe ice.\n"
            f"{self.render()}\nAnswer with one move: left, down, right or up."
        )
        return text, {"reward_fn": "env", "max_turns": self.max_turns}

    async def step(self, action: str) -> base.Outcome:
        self.turns += 1
        found = ACTION.findall(action)
        if not found:
            done = self.turns >= self.max_turns
            return base.Outcome(
                "Invalid move: answer left, down, right or up.", done=done, reward=0.0 if done else None,
                info={"invalid": True, "turns": self.turns},
            )  # fmt: skip
        move = found[-1].lower()
        if self.slippery and self.rng.random() < 2 / 3:
            i = ORDER.index(move)
            move = ORDER[(i + self.rng.choice((-1, 1))) % 4]
        dr, dc = MOVES[move]
        size = len(self.grid)
        self.pos = (min(max(self.pos[0] + dr, 0), size - 1), min(max(self.pos[1] + dc, 0), size - 1))
        cell = self.grid[self.pos[0]][self.pos[1]]
        info: dict[str, Any] = {"move": move, "turns": self.turns}
        if cell == "G":
            return base.Outcome(f"{self.render()}\nYou reached the goal.", done=True, reward=1.0, info=info)
        if cell == "H":
            return base.Outcome(f"{self.render()}\nYou fell into a hole.", done=True, reward=0.0, info=info)
        if self.turns >= self.max_turns:
            return base.Outcome(f"{self.render()}\nOut of turns.", done=True, reward=0.0, info=info)
        return base.Outcome(f"{self.render()}\nNext move?", done=False, info=info)

    async def close(self) -> None:
        return None


def _factory(seed: int, options: Mapping[str, Any], ctx: base.Context) -> FrozenLake:
    base.check_keys(options, {"size", "max_turns", "slippery"})
    return FrozenLake(
        seed, size=base.int_option(options, "size", 4, lo=2, hi=16),
        max_turns=base.int_option(options, "max_turns", 20, lo=1, hi=1000),
        slippery=base.bool_option(options, "slippery", False),
    )  # fmt: skip


SPEC = base.Spec("frozenlake", "multi-turn grid game; the env gives the reward (1.0 at the goal)", _factory)
