"""The ``treadle`` command.

Each subcommand lives in its own module, which exposes ``register(subparsers)``; the module sets
``func`` on its parser, which receives the parsed arguments and returns the exit code.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

import treadle

# Modules that contribute subcommands, in the order ``--help`` lists them.
COMMAND_MODULES = (
    "treadle.devcluster.cli",
    "treadle.api.cli",
    "treadle.operator.cli",
    "treadle.operator.jobcli",
    "treadle.weights.cli",
    "treadle.localmode.cli",
    "treadle.sim.cli",
    "treadle.trainer.cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="treadle",
        description="Kubernetes-native control plane for agentic RL rollout of LLMs.",
    )
    parser.add_argument("--version", action="version", version=f"treadle {treadle.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help()
        return 2
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
