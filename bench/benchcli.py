"""The command line of every benchmark: each field of its ``Config`` dataclass is a flag.

A field ``max_seqs`` answers to ``--max-seqs`` and ``--max_seqs``; its ``metadata["help"]`` is the
help text. Lists take one or more numbers, booleans are switches. ``timed_ms`` is the timing loop
the policy benchmarks share.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

C = TypeVar("C")


def parse(config: type[C], doc: str | None, argv: Sequence[str] | None = None) -> C:
    """``config`` built from the command line (``argv``, else ``sys.argv``), defaults from the fields."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    for f in dataclasses.fields(config):  # type: ignore[arg-type]
        factory = f.default_factory
        default = factory() if callable(factory) else f.default
        flags = dict.fromkeys((f"--{f.name.replace('_', '-')}", f"--{f.name}"))
        kwargs: dict[str, Any] = {"dest": f.name, "default": default}
        kwargs["help"] = f.metadata["help"].replace("%", "%%")  # argparse formats help with %
        if isinstance(default, bool):
            kwargs["action"] = argparse.BooleanOptionalAction if default else "store_true"
        elif isinstance(default, list):
            kwargs |= {"type": float, "nargs": "+"}
        else:
            kwargs["type"] = type(default)
        parser.add_argument(*flags, **kwargs)
    return config(**vars(parser.parse_args(argv)))


def timed_ms(fn: Callable[[], object], repeats: int) -> tuple[float, float]:
    """(median, min) milliseconds; the min shows the cost without noise from a shared host."""
    fn()  # warm
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples), min(samples)
