"""Admission in the scheduler: the queue of submitted prompt groups and which of them start now.

The decision is ``treadle.policy.admission``'s (AReaL's rule: whole groups start only while the
trajectories started stay within ``(alpha + version + 1) * batch_size`` and ``max_in_flight``);
this module keeps the queue, rejects repeated groups and bounds what may wait
(``Settings.max_pending_trajectories``). Used by ``SchedulerService.submit`` and its admission rounds.

It also queues again, first in line, a member whose environment session was lost with its env
server (``restart``): a pod of the env pool deleted or crashed mid-run took every session on it, and
those trajectories failed through no fault of the policy. Each runs again from its start, under its
own trajectory id (nothing of the lost run was stored), at most ``MAX_RESTARTS`` times; after that it
is stored as failed, with the reason.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence

from treadle import errors
from treadle.api import jobconfig
from treadle.policy import admission
from treadle.services.scheduler import protocol

MAX_RESTARTS = 2
"""Times one trajectory may run again from its start after losing its environment session."""
log = logging.getLogger(__name__)


class Admission:
    def __init__(self, tasks: Mapping[str, jobconfig.TaskConfig], settings: jobconfig.Settings) -> None:
        self.tasks = tasks
        self.settings = settings
        self.limits = admission.Limits(
            alpha=settings.alpha, batch_size=settings.batch_size, max_in_flight=settings.max_in_flight
        )
        self._pending: collections.deque[protocol.Work] = collections.deque()
        self.pending_trajectories = 0
        self._known_groups: set[str] = set()
        self.consumed: int | None = None
        """Completed trajectories the trainer has taken, as the buffer counts them (None: not known yet);
        ``policy.admission`` stops counting what it took beyond a batch per version."""
        self._restarts: collections.Counter[str] = collections.Counter()

    def prepare(
        self,
        groups: Sequence[protocol.PromptGroup],
        plan: Callable[[list[protocol.Work]], list[protocol.Work]] = list,
    ) -> list[protocol.Work]:
        """Validate ``groups`` (all or nothing) and return the new ones, sized by ``plan`` (DARTS's
        pools), without queueing them (``queue`` does, once they are recorded).

        Raises ``Overloaded`` if they would exceed ``max_pending_trajectories``.
        """
        work = protocol.validate_groups(groups, self.tasks)
        fresh = plan([w for w in work if w.group_id not in self._known_groups])
        members = sum(w.members for w in fresh)
        limit = self.settings.max_pending_trajectories
        if self.pending_trajectories + members > limit:
            raise errors.Overloaded(
                f"{self.pending_trajectories} trajectories pending; {members} more would exceed "
                f"max_pending_trajectories={limit}"
            )
        return fresh

    def queue(self, works: Sequence[protocol.Work]) -> None:
        """Queue ``works`` (from ``prepare``, or recovered after a restart) behind those waiting."""
        for w in works:
            self._known_groups.add(w.group_id)
            self._pending.append(w)
            self.pending_trajectories += w.members

    def restart(self, work: protocol.Work, trajectory_id: str, reason: str) -> bool:
        """Queue member ``trajectory_id`` of ``work`` again, first in line; False once it has run
        ``MAX_RESTARTS`` times again already (then it is stored as failed)."""
        if self._restarts[trajectory_id] >= MAX_RESTARTS:
            return False
        self._restarts[trajectory_id] += 1
        member = dataclasses.replace(work, only=(int(trajectory_id.rsplit("-", 1)[1]),))
        self._pending.appendleft(member)
        self.pending_trajectories += 1
        log.info("trajectory %s runs again from its start (%d of %d): %s",
                 trajectory_id, self._restarts[trajectory_id], MAX_RESTARTS, reason)  # fmt: skip
        return True

    def remember(self, group_id: str) -> None:
        """Treat ``group_id`` as submitted (a recovered group that needs no more work)."""
        self._known_groups.add(group_id)

    def submit(
        self,
        groups: Sequence[protocol.PromptGroup],
        plan: Callable[[list[protocol.Work]], list[protocol.Work]] = list,
    ) -> list[protocol.Work]:
        """``prepare`` and ``queue`` in one: returns those queued."""
        fresh = self.prepare(groups, plan)
        self.queue(fresh)
        return fresh

    def take(self, *, version: int, accepted: int, running: int) -> list[protocol.Work]:
        """Dequeue the groups that may start now, in submission order, with ``running`` trajectories in
        flight and ``accepted`` finished; each group taken counts as running for the next."""
        taken = []
        while self._pending:
            work = self._pending[0]
            state = admission.AdmissionState(
                version=version, accepted=accepted, running=running, consumed=self.consumed
            )
            if admission.admit_groups(state, self.limits, group_size=work.members, pending_groups=1) < 1:
                break
            taken.append(self._pending.popleft())
            self.pending_trajectories -= work.members
            running += work.members
        return taken
