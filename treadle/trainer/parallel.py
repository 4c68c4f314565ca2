"""The trainer's ranks and how the model is sharded over them: torch FSDP2 on a 1-D device mesh.

Called by ``treadle.trainer.job`` (in a pod, one process per rank under ``torchrun``), ``treadle
train`` (one rank) and the tests. Every rank holds a row shard of every parameter and of Adam's
state (``fully_shard`` per decoder layer, then the root for the embeddings and the head), so a
model ``N`` times larger than one device trains on ``N`` of them.

- **Ranks**: under ``torchrun`` (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and the rendezvous in the
  environment) the default process group spans them; without it the trainer is a group of one over
  an in-memory store, so there is one code path for one rank and for many.
- **Devices**: CUDA when there is a GPU (NCCL for the model's collectives, gloo beside it for the
  small object broadcasts), else CPU with gloo, which is what tests, the dev cluster and ``treadle
  train`` use.
- **Precision** (``bf16``, the default on GPUs): parameters are kept in float32 and cast to bfloat16
  for compute, gradients are reduced in float32 (FSDP2's ``MixedPrecisionPolicy``), and Adam's
  state is float32. On CPU everything is float32.
- **Activation checkpointing**: the model's own (``gradient_checkpointing_enable``, non-reentrant),
  which recomputes each decoder layer in the backward pass instead of keeping its activations.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from treadle import errors

COLLECTIVE_TIMEOUT = datetime.timedelta(minutes=30)
"""How long a rank waits in a collective: the leader's wait for a batch sits between two of them."""


@dataclasses.dataclass(frozen=True)
class World:
    rank: int
    size: int
    local_rank: int
    device: torch.device
    mesh: DeviceMesh
    objects: Any
    """A gloo group for pickled objects and CPU scalars (on GPUs the default group's NCCL cannot)."""

    @property
    def leader(self) -> bool:
        """Rank 0: the one that talks to the job's services and commits each version."""
        return self.rank == 0


def init(environ: dict[str, str] | None = None) -> World:
    """Join the trainer's process group (``torchrun``'s, or a group of one) and build the mesh."""
    env = dict(os.environ) if environ is None else environ
    cuda = torch.cuda.is_available()
    local_rank = int(env.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    backend = "cpu:gloo,cuda:nccl" if cuda else "gloo"
    if not dist.is_initialized():
        if "RANK" in env and "WORLD_SIZE" in env:
            dist.init_process_group(backend, timeout=COLLECTIVE_TIMEOUT)
        else:
            store = dist.HashStore()  # type: ignore[attr-defined]
            dist.init_process_group(backend, store=store, rank=0, world_size=1)
    size = dist.get_world_size()
    mesh = init_device_mesh(device.type, (size,), mesh_dim_names=("dp",))
    objects = dist.new_group(backend="gloo") if cuda else dist.group.WORLD
    return World(
        rank=dist.get_rank(), size=size, local_rank=local_rank, device=device, mesh=mesh, objects=objects
    )


def close() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def decoder_layers(model: Any) -> list[torch.nn.Module]:
    """The repeated blocks of a Hugging Face decoder (``model.model.layers``: Llama, Qwen2, Qwen3,
    Mistral and their kin), each its own FSDP unit."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    if not isinstance(layers, torch.nn.ModuleList) or not len(layers):
        raise errors.SpecError(
            f"{type(model).__name__} has no decoder layers at model.layers: the reference trainer shards "
            "Hugging Face decoder-only causal LMs (Llama, Qwen2, Qwen3, Mistral)",
            field="spec.agents[].model",
        )
    return list(layers)


def shard(model: Any, world: World, *, bf16: bool, checkpointing: bool) -> Any:
    """Move ``model`` to the rank's device and shard it in place; returns it (now an FSDP module)."""
    if bf16 and world.device.type != "cuda":
        raise errors.SpecError("bfloat16 training needs a GPU; on CPU the trainer is float32", field="bf16")
    model.to(world.device)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    precision = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if bf16
        else MixedPrecisionPolicy()
    )
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=world.mesh, mp_policy=precision)
    fully_shard(model, mesh=world.mesh, mp_policy=precision)
    return model


def broadcast(value: Any, world: World) -> Any:
    """``value`` from the leader to every rank (pickled; for batches and commands, not tensors)."""
    box = [value if world.leader else None]
    if world.size > 1:
        dist.broadcast_object_list(box, src=0, group=world.objects)
    return box[0]


def gather(value: Any, world: World) -> list[Any] | None:
    """Every rank's ``value`` at the leader, in rank order (None on the other ranks)."""
    if world.size == 1:
        return [value]
    out: list[Any] | None = [None] * world.size if world.leader else None
    dist.gather_object(value, out, dst=0, group=world.objects)
    return out


def all_gather(value: Any, world: World) -> list[Any]:
    """Every rank's ``value`` on every rank, in rank order."""
    if world.size == 1:
        return [value]
    out: list[Any] = [None] * world.size
    dist.all_gather_object(out, value, group=world.objects)
    return out


def all_sum(values: list[float], world: World) -> list[float]:
    """Element-wise sums of ``values`` over the ranks (float64, on the CPU group)."""
    if world.size == 1:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t, group=world.objects)
    return [float(v) for v in t.tolist()]
