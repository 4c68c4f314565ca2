"""Heddle's trajectory-length prediction in the scheduler (§4.1): one ``heddle.predictor.HistoryModel``
per task, learned from the task's completed trajectories, asked at admission and after every turn.

Used by ``SchedulerService`` (learn at admission and finish) and the turn loop (predict per turn).
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from treadle.policy.heddle import predictor
from treadle.services.scheduler import protocol, stats, trajectory

LEARN_EVERY = 8
"""Completed trajectories a task's predictor collects before it re-learns (``learn`` re-sorts its window)."""


class Predictions:
    def __init__(self, tasks: Iterable[str], metrics: stats.SchedulerMetrics) -> None:
        self.metrics = metrics
        # The group's weight estimated from the history (Bühlmann credibility), not a fixed pull to the
        # task mean that narrows the spread the presorted placement needs (heddle.predictor).
        self.models = {name: predictor.HistoryModel(shrink=None) for name in tasks}
        self._to_learn: dict[str, list[predictor.Finished]] = {name: [] for name in self.models}

    def predict(self, t: trajectory.Traj) -> None:
        obs = predictor.Observation(
            task=t.work.task.name, group_id=prompt_key(t.work), tokens_so_far=t.tokens_so_far,
            steps_done=len(t.step_tokens),
        )  # fmt: skip
        t.predicted_remaining = self.models[t.work.task.name].predict(obs)
        t.predictions.append((t.tokens_so_far, t.predicted_remaining))

    def learn(self, t: trajectory.Traj) -> None:
        """Feed a completed trajectory to its task's predictor (re-learned every ``LEARN_EVERY``)."""
        name = t.work.task.name
        batch = self._to_learn[name]
        finished = predictor.Finished(
            task=name,
            group_id=prompt_key(t.work),
            total_tokens=t.tokens_so_far,
            step_tokens=(*t.step_tokens,),
        )
        batch.append(finished)
        for steps, (so_far, predicted) in enumerate(t.predictions):
            error = abs(predicted - (t.tokens_so_far - so_far))
            self.metrics.prediction_error_of("3+" if steps >= 3 else str(steps)).observe(error)
        if len(batch) >= LEARN_EVERY or name not in self.models[name].tasks:
            self.learn_pending()

    def learn_pending(self) -> None:
        for name, batch in self._to_learn.items():
            if batch:
                self.models[name] = predictor.learn(self.models[name], batch)
                batch.clear()


def prompt_key(work: protocol.Work) -> str:
    """The predictor's sibling key: the prompt (environment seed and options), not the group id.

    Members of one GRPO group share it, and so do the groups of later steps that sample the same
    prompt again (RL epochs revisit prompts): the history-based estimate of RhymeRL / Seer, "past
    rollouts of the same prompt", on top of the group's finished siblings.
    """
    options = json.dumps(work.options, sort_keys=True) if work.options else ""
    return f"{work.seed}:{options}"
