"""Sharded state in and out of the weight store: each rank writes its own rows, rank 0 commits.

Called by ``treadle.trainer.group`` after every step (the weights, then Adam's state) and by a
restarted trainer (both back). Nothing is gathered onto one rank to publish: every rank packs the
rows of each parameter it holds (FSDP2 shards dimension 0, as ``torch.chunk`` does) into buckets
numbered after the lower ranks' (one all-gather of bucket counts), writes them, and sends rank 0
the list of what it wrote (one gather of small records). Rank 0 then writes the manifest, which
lists every part: the commit point, as for an unsharded version (``treadle.weights.publish``). A
rank that failed to write makes rank 0 raise before committing, so no partial version is ever
visible. Readers assemble the parts (``treadle.weights.tensors.rebuild``), so engines, resumes and
the CLI read a sharded version as any other.

A restart loads full tensors into the sharded model and optimizer with torch's own
``set_model_state_dict`` / ``set_optimizer_state_dict`` (each rank takes its rows), so a group may
come back with another number of ranks.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.tensor import DTensor, Shard

from treadle import errors
from treadle.trainer import parallel
from treadle.weights import layout, publish, tensors


def rows_of(rows: int, rank: int, ranks: int) -> tuple[int, int]:
    """The rows ``[start, stop)`` rank ``rank`` of ``ranks`` holds of a dimension of ``rows``
    (``torch.chunk``'s split, FSDP2's: chunks of ceil(rows / ranks), the last ones short or empty)."""
    chunk = -(-rows // ranks)
    return min(rank * chunk, rows), min((rank + 1) * chunk, rows)


def local_parts(state: Mapping[str, Any], world: parallel.World) -> dict[str, Any]:
    """This rank's part of ``state``: its rows of every sharded tensor (``tensors.Shard``, or the
    tensor itself when one rank holds it all), and the unsharded tensors on rank 0 only."""
    out: dict[str, Any] = {}
    for name, value in state.items():
        if not isinstance(value, DTensor):
            if world.leader:
                out[name] = value.detach() if isinstance(value, torch.Tensor) else torch.tensor(value)
            continue
        if tuple(value.placements) != (Shard(0),):
            raise errors.SpecError(
                f"expected a tensor sharded on dimension 0, got placements {value.placements}", field=name
            )
        local = value.to_local().detach()
        rows = int(value.shape[0])
        start, stop = rows_of(rows, world.rank, world.size)
        if local.shape[0] != stop - start:
            raise errors.SpecError(
                f"rank {world.rank} holds {local.shape[0]} rows of {rows}, expected {stop - start}",
                field=name,
            )
        if stop == start:
            continue
        out[name] = local if stop - start == rows else tensors.Shard(local, start, rows)
    return out


def publish_parts(
    weights: publish.Publisher, state: Mapping[str, Any], version: int, world: parallel.World
) -> layout.Manifest | None:
    """Every rank writes its part of ``state`` as ``version``; rank 0 commits and gets the manifest."""
    mine = local_parts(state, world)
    counts = parallel.all_gather(weights.plan_part(mine) if mine else 0, world)
    written: publish.Part | str
    try:
        written = (
            weights.write_part(mine, version, first_bucket=sum(counts[: world.rank]))
            if mine
            else publish.Part((), ())
        )
    except errors.TreadleError as exc:  # every rank must reach the gather, or rank 0 waits forever
        written = f"rank {world.rank}: {exc}"
    parts = parallel.gather(written, world)
    if parts is None:
        return None
    failed = [p for p in parts if isinstance(p, str)]
    if failed:
        raise errors.Unavailable(f"version {version} not committed: {'; '.join(failed)}")
    return weights.commit_parts(version, [p for p in parts if isinstance(p, publish.Part)])


def load_model(model: Any, full: Mapping[str, Any]) -> None:
    """Load full tensors (every rank passes them) into the sharded ``model``."""
    set_model_state_dict(model, dict(full), options=StateDictOptions(full_state_dict=True))


def optimizer_state(model: Any, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Adam's per-parameter state as ``<parameter name>.<key>`` (a collective: every rank calls it)."""
    state: dict[str, dict[str, Any]] = get_optimizer_state_dict(model, optimizer)["state"]  # type: ignore[assignment]
    return {f"{fqn}.{key}": value for fqn, values in state.items() for key, value in values.items()}


def load_optimizer(model: Any, optimizer: torch.optim.Optimizer, full: Mapping[str, Any]) -> None:
    """Load ``optimizer_state``'s names, as full tensors, into the sharded optimizer (a collective)."""
    state: dict[str, dict[str, Any]] = {}
    for name, value in full.items():
        fqn, sep, key = name.rpartition(".")
        if not sep or not fqn:
            raise errors.SpecError("expected '<parameter name>.<key>'", field="optimizer state", value=name)
        state.setdefault(fqn, {})[key] = value
    groups = get_optimizer_state_dict(model, optimizer)["param_groups"]
    set_optimizer_state_dict(
        model, optimizer, {"state": state, "param_groups": groups},  # type: ignore[dict-item]
        options=StateDictOptions(full_state_dict=True),
    )  # fmt: skip
