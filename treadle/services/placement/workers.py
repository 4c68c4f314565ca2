"""What placement keeps per worker and per task, shared by the service and its inter-agent moves."""

from __future__ import annotations

import dataclasses

from treadle.policy import affinity
from treadle.v1 import placement_pb2


@dataclasses.dataclass
class Profile:
    trajectories: int = 0
    turns: int = 0
    first_prompt_tokens: int = 0
    output_tokens: int = 0
    released_turns: int = 0

    def to_policy(self) -> affinity.TaskProfile:
        return affinity.TaskProfile(
            mean_turns=self.turns / self.trajectories,
            prompt_tokens=self.first_prompt_tokens / self.trajectories,
            response_tokens=self.output_tokens / max(1, self.released_turns),
        )


@dataclasses.dataclass
class Worker:
    info: placement_pb2.Worker
    load: placement_pb2.WorkerLoad
    outstanding: int = 0
    draining: bool = False
    moving_to: str = ""
    """The receiving agent while an inter-agent rebalance drains and swaps this worker."""
    seen: float = 0.0
    """When its agent last registered or reported (placement's clock): a silent one is lost."""


def sticky_key(trajectory_id: str, agent: str) -> str:
    """Stickiness is per (trajectory, agent): each agent's worker holds that agent's prefix cache."""
    return f"{trajectory_id}\x00{agent}" if agent else trajectory_id


def load(w: Worker) -> int:
    return max(w.outstanding, w.load.running + w.load.waiting)
