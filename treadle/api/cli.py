"""``treadle crd``: print, write or check the generated RolloutJob CRD and its field reference;
``treadle validate FILE``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

from treadle import errors
from treadle.api import crd, reference, v1alpha1


def register(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser("crd", help="print, write or check the RolloutJob CRD")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--docs", action="store_true", help="print the field reference (Markdown) instead")
    mode.add_argument(
        "--write", action="store_true", help="rewrite the committed copies and the reference under --root"
    )
    mode.add_argument("--check", action="store_true", help="exit 1 if a committed copy drifted")
    parser.add_argument("--root", type=Path, default=Path.cwd(), help="repository root (default: .)")
    parser.set_defaults(func=_crd)
    val = sub.add_parser("validate", help="validate RolloutJob manifests as the API server would")
    val.add_argument("files", nargs="+", type=Path, metavar="FILE")
    val.set_defaults(func=_validate)


def _crd(args: argparse.Namespace) -> int:
    if args.docs:
        sys.stdout.write(reference.render_markdown())
        return 0
    if not (args.write or args.check):
        sys.stdout.write(crd.render_yaml())
        return 0
    drifted = []
    for path, text in (crd.expected_files(args.root) | reference.expected_files(args.root)).items():
        current = path.read_text() if path.is_file() else None
        if current == text:
            continue
        if args.write:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote {path}")
        else:
            drifted.append(path)
    for path in drifted:
        print(f"{path}: differs from what treadle/api generates; run `treadle crd --write`",
              file=sys.stderr)  # fmt: skip
    return 1 if drifted else 0


def _validate(args: argparse.Namespace) -> int:
    """Every problem of every RolloutJob in the files, each naming the file and its field; never a
    traceback (a file that cannot be read or parsed is one problem, naming the file)."""
    code = 0
    for path in args.files:
        try:
            docs = [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]
        except yaml.YAMLError as exc:
            print(f"{path}: not valid YAML: {_yaml_problem(exc)}", file=sys.stderr)
            code = 1
            continue
        except (OSError, UnicodeDecodeError) as exc:
            print(f"{path}: cannot read: {exc}", file=sys.stderr)
            code = 1
            continue
        except Exception as exc:  # e.g. RecursionError on absurd nesting: still no traceback
            print(f"{path}: cannot read: {type(exc).__name__}: {exc}", file=sys.stderr)
            code = 1
            continue
        if not docs:
            print(f"{path}: holds no document: expected a RolloutJob", file=sys.stderr)
            code = 1
        for index, doc in enumerate(docs):
            where = str(path) if len(docs) == 1 else f"{path} (document {index + 1})"
            try:
                job = v1alpha1.parse_job(doc)
            except errors.SpecError as exc:
                for problem in exc.problems:
                    print(f"{where}: {problem}", file=sys.stderr)
                code = 1
            except Exception as exc:  # a bug in a check, reported as such instead of a traceback
                print(f"{where}: could not be validated ({type(exc).__name__}: {exc})", file=sys.stderr)
                code = 1
            else:
                print(f"{where}: {job.name} ok")
    return code


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """One line: where in the file and what (``yaml`` names the text it parsed, not the file)."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        return f"line {mark.line + 1}, column {mark.column + 1}: {exc.problem or exc.context}"
    return " ".join(str(exc).split())
