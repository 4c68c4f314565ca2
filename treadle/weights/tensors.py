"""Turn a state dict into raw byte views and back, for numpy arrays and (if installed) torch tensors.

Called by the publisher (``flatten``) and by readers (``rebuild``). torch is never required: a
tensor is recognised by duck typing and only then is torch imported. Dtypes are carried by name;
``bfloat16`` and the float8 types have no numpy equivalent, so as numpy they come back as their
unsigned-integer bit patterns (same width) and as torch with their real dtype.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Mapping
from typing import Any, Literal

import numpy as np

from treadle import errors
from treadle.weights import layout

# dtype name -> numpy dtype used to hold its bits when read back as numpy.
DTYPES: dict[str, str] = {
    "float64": "float64", "float32": "float32", "float16": "float16",
    "bfloat16": "uint16", "float8_e4m3fn": "uint8", "float8_e5m2": "uint8",
    "int64": "int64", "int32": "int32", "int16": "int16", "int8": "int8",
    "uint64": "uint64", "uint32": "uint32", "uint16": "uint16", "uint8": "uint8", "bool": "bool",
}  # fmt: skip

Kind = Literal["numpy", "torch"]


@dataclasses.dataclass(frozen=True)
class Flat:
    """One tensor (or a part of one) as a 1-D uint8 view over its (contiguous, CPU) bytes."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    """The whole tensor's shape."""
    data: np.ndarray[Any, np.dtype[np.uint8]]
    rows: tuple[int, int] | None = None
    """For a part: its rows ``[start, stop)`` of the first dimension (``layout.TensorEntry.rows``)."""


@dataclasses.dataclass(frozen=True)
class Shard:
    """A state-dict value that is rows ``[start, start + len(local))`` of a tensor of ``rows`` rows: one
    rank's part of a sharded parameter, published without gathering the rest."""

    local: Any
    """The rows this rank holds (numpy array or torch tensor)."""
    start: int
    rows: int


def flatten(state_dict: Mapping[str, Any]) -> list[Flat]:
    """Byte views of every tensor, in the mapping's order. Bad entries raise SpecError naming them."""
    if not isinstance(state_dict, Mapping) or not state_dict:
        raise errors.SpecError("must be a non-empty mapping of name -> tensor", field="state_dict")
    out = []
    for name, value in state_dict.items():
        field = f"state_dict[{name!r}]"
        if not isinstance(name, str) or not name:
            raise errors.SpecError("tensor names must be non-empty strings", field=field, value=name)
        if isinstance(value, Shard):
            out.append(_part(name, value, field))
        elif isinstance(value, np.ndarray):
            out.append(_from_numpy(name, value, field))
        elif _is_torch(value):
            out.append(_from_torch(name, value, field))
        else:
            raise errors.SpecError(
                f"expected a numpy array or torch tensor, got {type(value).__name__}", field=field
            )
    return out


def _part(name: str, shard: Shard, field: str) -> Flat:
    whole = _from_numpy(name, shard.local, field) if isinstance(shard.local, np.ndarray) else None
    if whole is None and not _is_torch(shard.local):
        raise errors.SpecError(
            f"expected a numpy array or torch tensor, got {type(shard.local).__name__}", field=field
        )
    flat = whole or _from_torch(name, shard.local, field)
    if not flat.shape or not 0 <= shard.start <= shard.start + flat.shape[0] <= shard.rows:
        raise errors.SpecError(
            f"a part of {shard.rows} rows starting at {shard.start} cannot hold {flat.shape}", field=field
        )
    rows = (shard.start, shard.start + flat.shape[0])
    return dataclasses.replace(flat, shape=(shard.rows, *flat.shape[1:]), rows=rows)


def _from_numpy(name: str, value: np.ndarray[Any, Any], field: str) -> Flat:
    dtype = value.dtype.name
    if dtype not in DTYPES or DTYPES[dtype] != dtype:
        raise errors.SpecError(f"unsupported numpy dtype {dtype}", field=field, value=dtype)
    data = np.ascontiguousarray(value).reshape(-1).view(np.uint8)
    return Flat(name, dtype, tuple(int(d) for d in value.shape), data)


def _is_torch(value: object) -> bool:
    return type(value).__module__.startswith("torch") and hasattr(value, "detach")


def _from_torch(name: str, value: Any, field: str) -> Flat:
    torch = importlib.import_module("torch")
    dtype = str(value.dtype).removeprefix("torch.")
    if dtype not in DTYPES:
        raise errors.SpecError(f"unsupported torch dtype {dtype}", field=field, value=dtype)
    t = value.detach().to("cpu").contiguous()
    data = t.reshape(-1).view(torch.uint8).numpy()
    return Flat(name, dtype, tuple(int(d) for d in t.shape), data)


def rebuild(
    manifest: layout.Manifest, buckets: np.ndarray[Any, np.dtype[np.uint8]], *, kind: Kind = "numpy"
) -> dict[str, Any]:
    """Tensors of ``manifest`` as zero-copy views into ``buckets`` (all buckets back to back).

    The caller must have validated every bucket first; the views share ``buckets``' memory.
    Parts of a tensor (a sharded trainer's ranks published them apart) are copied into one new
    tensor each: the only tensors that are not views.
    """
    starts = manifest.bucket_offsets()
    torch = importlib.import_module("torch") if kind == "torch" else None
    out: dict[str, Any] = {}
    for t in manifest.tensors:
        if t.dtype not in DTYPES:
            raise layout.CorruptVersion(
                f"v{manifest.version}: tensor {t.name!r} has unknown dtype {t.dtype!r}"
            )
        at = starts[t.bucket] + t.offset
        raw = buckets[at : at + t.nbytes]
        carrier = np.dtype(DTYPES[t.dtype])
        shape = t.part_shape
        if t.nbytes != carrier.itemsize * int(np.prod(shape, dtype=np.int64)):
            raise layout.CorruptVersion(
                f"v{manifest.version}: tensor {t.name!r} size does not match its shape"
            )
        if torch is None:
            view: Any = raw.view(carrier).reshape(shape)
        else:
            # torch.from_numpy refuses read-only arrays; the buffer is ours and writable.
            view = torch.from_numpy(raw).view(getattr(torch, t.dtype)).reshape(shape)
        if t.rows is None:
            out[t.name] = view
            continue
        if t.name not in out:
            out[t.name] = (
                np.empty(t.shape, dtype=carrier)
                if torch is None
                else torch.empty(t.shape, dtype=getattr(torch, t.dtype))
            )
        out[t.name][t.rows[0] : t.rows[1]] = view
    return out
