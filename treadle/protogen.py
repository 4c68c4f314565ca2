"""Generate the gRPC stubs in ``treadle/v1`` from ``proto/treadle/v1/*.proto``.

The stubs are committed so an install needs no protoc; ``check()`` (run by a unit test) fails when
they differ from what the pinned grpcio-tools would generate now. ``python -m treadle.protogen``
rewrites them.
"""

from __future__ import annotations

import filecmp
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROTO_ROOT = ROOT / "proto"
OUT_PACKAGE = ROOT / "treadle" / "v1"
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi")


def protos() -> list[Path]:
    return sorted((PROTO_ROOT / "treadle" / "v1").glob("*.proto"))


def generate(out_root: Path) -> Path:
    """Write the stubs under ``out_root/treadle/v1`` and return that directory."""
    from grpc_tools import protoc

    files = [str(p.relative_to(PROTO_ROOT)) for p in protos()]
    if not files:
        raise RuntimeError(f"proto: no .proto files under {PROTO_ROOT / 'treadle' / 'v1'}")
    # The plugins sit beside the interpreter; the venv need not be on PATH.
    bindir = Path(sys.executable).parent
    args = [
        "grpc_tools.protoc", f"-I{PROTO_ROOT}",
        f"--plugin=protoc-gen-mypy={bindir / 'protoc-gen-mypy'}",
        f"--plugin=protoc-gen-mypy_grpc={bindir / 'protoc-gen-mypy_grpc'}",
        f"--python_out={out_root}", f"--grpc_python_out={out_root}",
        f"--mypy_out={out_root}", f"--mypy_grpc_out={out_root}",
        *files,
    ]  # fmt: skip
    if protoc.main(args) != 0:
        raise RuntimeError("proto: protoc failed; see its message above")
    out = out_root / "treadle" / "v1"
    (out / "__init__.py").write_text(
        '"""Generated gRPC stubs; edit proto/treadle/v1 and run `make proto`."""\n'
    )
    return out


def _generated(directory: Path) -> set[str]:
    return {p.name for p in directory.iterdir() if p.name.endswith(GENERATED_SUFFIXES)} | {"__init__.py"}


def stale_files() -> list[str]:
    """Names of committed stub files that are missing, extra or differ from a fresh generation."""
    with tempfile.TemporaryDirectory() as tmp:
        fresh = generate(Path(tmp))
        want = _generated(fresh)
        have = _generated(OUT_PACKAGE) if OUT_PACKAGE.is_dir() else set()
        diff = sorted(want ^ have)
        diff += sorted(n for n in want & have if not filecmp.cmp(fresh / n, OUT_PACKAGE / n, shallow=False))
        return diff


def write() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        fresh = generate(Path(tmp))
        if OUT_PACKAGE.exists():
            shutil.rmtree(OUT_PACKAGE)
        shutil.copytree(fresh, OUT_PACKAGE)


if __name__ == "__main__":
    write()
    print(f"wrote {len(_generated(OUT_PACKAGE))} files to {OUT_PACKAGE.relative_to(ROOT)}", file=sys.stderr)
