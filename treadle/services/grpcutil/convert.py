"""Conversions between a service's protocol dataclasses and the proto messages of the same field names.

Called at the gRPC edge only (each service's ``grpc_server`` and ``client``), so the services
themselves work on their own ``protocol`` types.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

T = TypeVar("T")


def to_pb(value: Any, msg_cls: type[T], **nested: Any) -> T:
    """The message of a protocol value: its fields (``None`` ones left unset), with ``nested`` (the
    caller's conversions of nested values) in place of the fields of those names."""
    fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    fields.update(nested)
    return msg_cls(**{k: v for k, v in fields.items() if v is not None})


def from_pb(cls: type[T], msg: Any, **nested: Any) -> T:
    """The protocol value of a message whose fields are named as ``cls``'s: a field whose default is
    ``None`` is ``None`` while unset (proto ``optional``); ``nested`` as in ``to_pb``."""
    values = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name in nested:
            values[f.name] = nested[f.name]
        elif f.default is None and not msg.HasField(f.name):
            values[f.name] = None
        else:
            values[f.name] = getattr(msg, f.name)
    return cls(**values)
