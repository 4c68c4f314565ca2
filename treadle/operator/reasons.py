"""Machine-readable condition and Event reasons of a RolloutJob (CamelCase, stable API).

Read by users (``kubectl get rj -o wide`` shows the Ready reason), dashboards and queueing
systems; written only by ``treadle.operator.status`` and ``treadle.operator.handlers``.
"""

from __future__ import annotations

ALL_RESOURCES_READY = "AllResourcesReady"
"""Ready=True: every child Deployment has all its replicas ready on the latest spec."""
PODS_NOT_READY = "PodsNotReady"
"""Ready=False / Progressing=True: children exist but some replicas are starting or rolling."""
INSUFFICIENT_GPU_CAPACITY = "InsufficientGPUCapacity"
"""Degraded=True: the job asks more GPUs of a class than the cluster has, or pods cannot fit."""
UNSCHEDULABLE = "Unschedulable"
"""Degraded=True: pods cannot be scheduled for a reason other than GPUs (CPU, memory, selectors)."""
IMAGE_PULL_BACK_OFF = "ImagePullBackOff"
"""Degraded=True: a container image cannot be pulled."""
CRASH_LOOP_BACK_OFF = "CrashLoopBackOff"
"""Degraded=True: a container keeps crashing."""
DATASET_UNUSABLE = "DatasetUnusable"
"""Degraded=True: the feeder cannot read a task's dataset (missing column, unreadable file, unreachable
URL); the message names ``spec.tasks[i].dataset...``. The feeder stays up and reads it again."""
INVALID_SPEC = "InvalidSpec"
"""Degraded=True: the spec failed validation in the operator (the message names the field)."""
REDIS_UNAVAILABLE = "RedisUnavailable"
"""Degraded=True: the operator cannot set up the job's Redis user (the chart's Redis is not running,
e.g. its volume claim is unbound); it retries every 10 s and writes nothing else until it can."""
SUSPENDED = "Suspended"
"""Suspended=True: spec.suspend scaled every child to zero."""
RUNNING = "Running"
"""Suspended=False."""
AS_EXPECTED = "AsExpected"
"""Degraded=False."""
RECONCILED = "Reconciled"
"""Progressing=False: nothing left to roll."""
APPLIED = "ChildrenApplied"
"""Event: the reconciler created or updated children."""
PRUNED = "ChildrenDeleted"
"""Event: the reconciler deleted children the spec no longer asks for."""
TRAINER_RESTARTED = "TrainerRestarted"
"""Event (Warning): the trainer group's restarts (``status.trainer.restarts``) went up: a rank died, the
group's containers restart in place (or the Job replaces a failed pod) and the group forms again."""

# Order in which pod problems decide the Degraded reason when several occur at once.
DEGRADED_PRIORITY = (
    INSUFFICIENT_GPU_CAPACITY, IMAGE_PULL_BACK_OFF, CRASH_LOOP_BACK_OFF, DATASET_UNUSABLE, UNSCHEDULABLE,
)  # fmt: skip
IMAGE_PULL_WAITING = frozenset({"ImagePullBackOff", "ErrImagePull", "InvalidImageName", "ErrImageNeverPull"})
