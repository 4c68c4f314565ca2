"""The reward stage of the scheduler: score a finished trajectory with its task's reward function.

Called by the turn loop after the environment closes; counts the trajectories waiting for or in
scoring (``backlog``, on which the operator scales the reward gateway).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from treadle.services.reward import protocol as reward_protocol
from treadle.services.scheduler import protocol, retry, trajectory


class RewardStage:
    def __init__(self, reward: protocol.Reward, retrier: retry.Retrier) -> None:
        self.reward = reward
        self.retrier = retrier
        self.scoring: set[str] = set()
        """Trajectories waiting for or in scoring."""

    async def score(
        self, t: trajectory.Traj, info: Mapping[str, Any], prompt: str, env_reward: float | None = None
    ) -> float:
        """Score with the task's reward function; ``env_reward`` (the environment's own, from its last
        step) goes along as ``metadata.env_reward`` for the gateway's ``env`` function."""
        task = t.work.task
        reward_fn = task.reward_fn or str(info.get("reward_fn") or "")
        if not reward_fn:
            raise trajectory.Failed(
                f"reward: task {task.name!r} names no reward function and the environment gave none"
            )
        reference = info.get("reference")
        req = reward_protocol.ScoreRequest(
            trajectory_id=t.tid, reward_fn=reward_fn, response=t.turns[-1].text if t.turns else "",
            reference=None if reference is None else str(reference), prompt=prompt,
            metadata={"task": task.name, "turns": len(t.turns),
                      **({} if env_reward is None else {"env_reward": env_reward})},
        )  # fmt: skip
        clock = self.retrier.clock
        began = clock()
        result = await self.retrier.call(t, "reward", "score", lambda: self.reward.score(req))
        self.retrier.metrics.reward_seconds.observe(clock() - began)
        return float(result.reward)
