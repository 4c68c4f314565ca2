"""Validation of buffer requests and the conversions between proto messages and store records.

Called by ``BufferService`` before anything touches the store, so bad input changes nothing stored;
every error names the offending field as ``trajectories[i].<field>``.
"""

from __future__ import annotations

import dataclasses
import re
import typing
from collections.abc import Sequence

from treadle.errors import SpecError
from treadle.v1 import common_pb2

STATUSES = ("completed", "failed", "aborted")
MAX_ID_CHARS = 200
CONTROL = re.compile(r"[\x00-\x1f\x7f]")
MAX_GROUP_SIZE = 4096
MAX_BATCH_SIZE = 65_536
MAX_TIMEOUT_S = 3600.0
MAX_LEASE_S = 86_400.0
DEFAULT_MAX_TRAJECTORY_BYTES = 8 * 1024 * 1024


class Record(typing.NamedTuple):
    """One trajectory as the store keeps it: the fields batching needs, and the encoded message.

    A named tuple, not a frozen dataclass: puts build thousands per second and this is cheaper.
    """

    trajectory_id: str
    group_id: str
    task: str
    agent: str
    """The agent whose experience table holds it (FlexMARL); empty for a single-policy job."""
    group_size: int
    init_version: int
    status: str
    reason: str
    payload: bytes


@dataclasses.dataclass(frozen=True)
class PutResult:
    stored: int
    duplicates: int


def to_records(trajectories: Sequence[common_pb2.Trajectory], *, max_bytes: int) -> list[Record]:
    """Validate every trajectory (all or nothing) and encode it."""
    if not trajectories:
        raise SpecError("at least one trajectory is required", field="trajectories")
    out = []
    ids: set[str] = set()
    for i, t in enumerate(trajectories):
        at = f"trajectories[{i}]"
        _check_id(t.trajectory_id, f"{at}.trajectory_id")
        _check_id(t.group_id, f"{at}.group_id")
        _check_id(t.task, f"{at}.task")
        if t.agent:
            _check_id(t.agent, f"{at}.agent")
        if not 1 <= t.group_size <= MAX_GROUP_SIZE:
            raise SpecError(
                f"must be within [1, {MAX_GROUP_SIZE}]", field=f"{at}.group_size", value=t.group_size
            )
        if t.status not in STATUSES:
            raise SpecError(f"must be one of {list(STATUSES)}", field=f"{at}.status", value=t.status)
        if t.status != "completed" and not t.reason:
            raise SpecError("a failed or aborted trajectory must say why", field=f"{at}.reason")
        if t.init_version < 0:
            raise SpecError("must be >= 0", field=f"{at}.init_version", value=t.init_version)
        for j, turn in enumerate(t.turns):
            n = len(turn.output_token_ids)
            if len(turn.output_logprobs) not in (0, n) or len(turn.output_versions) not in (0, n):
                raise SpecError(
                    "output_logprobs and output_versions must be empty or as long as output_token_ids",
                    field=f"{at}.turns[{j}]",
                )
        payload = t.SerializeToString()
        if len(payload) > max_bytes:
            raise SpecError(
                f"{len(payload)} bytes exceeds the limit of {max_bytes}", field=at, value=len(payload)
            )
        if t.trajectory_id in ids:
            raise SpecError("repeated within one request", field=f"{at}.trajectory_id", value=t.trajectory_id)
        ids.add(t.trajectory_id)
        out.append(
            Record(
                trajectory_id=t.trajectory_id,
                group_id=t.group_id,
                task=t.task,
                agent=t.agent,
                group_size=t.group_size,
                init_version=t.init_version,
                status=t.status,
                reason=t.reason,
                payload=payload,
            )
        )
    _check_groups_agree(out)
    return out


def _check_id(value: str, field: str) -> None:
    if not value:
        raise SpecError("must not be empty", field=field)
    if len(value) > MAX_ID_CHARS or CONTROL.search(value):
        message = f"must be at most {MAX_ID_CHARS} characters, none of them control characters"
        raise SpecError(message, field=field, value=value[:50])


def _check_groups_agree(records: Sequence[Record]) -> None:
    first: dict[str, tuple[int, Record]] = {}
    for i, r in enumerate(records):
        seen = first.setdefault(r.group_id, (i, r))[1]
        if (seen.task, seen.agent, seen.group_size) != (r.task, r.agent, r.group_size):
            raise SpecError(
                f"group {r.group_id!r} differs in task, agent or group_size from an earlier member",
                field=f"trajectories[{i}]",
            )


def check_batch_request(
    *, batch_size: int, timeout_s: float, lease_s: float, micro_batch_size: int | None, agent: str = ""
) -> None:
    if agent:
        _check_id(agent, "agent")
    if not 1 <= batch_size <= MAX_BATCH_SIZE:
        raise SpecError(f"must be within [1, {MAX_BATCH_SIZE}]", field="batch_size", value=batch_size)
    if not 0.0 <= timeout_s <= MAX_TIMEOUT_S:
        raise SpecError(f"must be within [0, {MAX_TIMEOUT_S}]", field="timeout_s", value=timeout_s)
    if not 0.0 <= lease_s <= MAX_LEASE_S:
        raise SpecError(f"must be within [0, {MAX_LEASE_S}]", field="lease_s", value=lease_s)
    if micro_batch_size is not None and not 1 <= micro_batch_size <= batch_size:
        raise SpecError("must be within [1, batch_size]", field="micro_batch_size", value=micro_batch_size)


def check_batch_id(batch_id: str) -> None:
    _check_id(batch_id, "batch_id")
