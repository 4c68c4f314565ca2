"""Issue 13's size limits: no module in ``treadle/`` over 500 lines (the generated protobuf stubs
aside), and ``SchedulerService`` a short composition of its parts (under 250 lines)."""

from __future__ import annotations

import ast
from pathlib import Path

TREADLE = Path(__file__).resolve().parents[3] / "treadle"
MAX_MODULE_LINES = 500
SCHEDULER = TREADLE / "services" / "scheduler" / "service.py"
SCHEDULER_SERVICE_LIMIT = 250
"""``SchedulerService`` spans fewer lines than this."""


def _generated(path: Path) -> bool:
    """``protoc``'s output (``treadle/v1/*_pb2.py``, ``*_pb2_grpc.py``): regenerated, never edited."""
    return path.parent == TREADLE / "v1" and "_pb2" in path.stem


def test_no_module_over_500_lines() -> None:
    modules = [p for p in sorted(TREADLE.rglob("*.py")) if not _generated(p)]
    assert len(modules) > 100  # the walk found the package, not an empty folder
    sizes = {p.relative_to(TREADLE.parent): len(p.read_text().splitlines()) for p in modules}
    too_long = [f"{path}: {n} lines" for path, n in sizes.items() if n > MAX_MODULE_LINES]
    assert not too_long, f"modules over {MAX_MODULE_LINES} lines: {too_long}"


def test_scheduler_service_is_short() -> None:
    tree = ast.parse(SCHEDULER.read_text())
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "SchedulerService"]
    assert cls.end_lineno is not None
    first = min([cls.lineno, *(d.lineno for d in cls.decorator_list)])
    span = cls.end_lineno - first + 1
    assert span < SCHEDULER_SERVICE_LIMIT, (
        f"{SCHEDULER.relative_to(TREADLE.parent)}: SchedulerService spans {span} lines "
        f"(lines {first}-{cls.end_lineno}); it must be under {SCHEDULER_SERVICE_LIMIT}"
    )
