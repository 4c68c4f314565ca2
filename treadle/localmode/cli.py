"""``treadle run FILE``: the subcommand that runs a RolloutJob locally (see ``treadle.localmode.run``)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import yaml

from treadle import errors
from treadle.api import v1alpha1
from treadle.localmode import plan, run, stack

T = TypeVar("T")


class Stopped(Exception):
    """SIGINT or SIGTERM ended the run; every service process was stopped first."""

    def __init__(self, sig: signal.Signals) -> None:
        super().__init__(sig.name)
        self.signal = sig


async def until_signalled(main: Coroutine[Any, Any, T]) -> T:
    """Run ``main``; SIGINT or SIGTERM cancels it, so the stack it holds stops its processes.

    The services run in sessions of their own (``stack``), so a signal to this process's group
    reaches none of them: without this, SIGTERM would end ``treadle run`` and leave them running.
    """
    task = asyncio.ensure_future(main)
    loop = asyncio.get_running_loop()
    got: list[signal.Signals] = []

    def stop(sig: signal.Signals) -> None:
        got.append(sig)
        task.cancel()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop, sig)
    try:
        return await task
    except asyncio.CancelledError:
        if got:
            raise Stopped(got[0]) from None
        raise
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "run",
        help="run a RolloutJob on this machine (every service a local process; SIMULATED ENGINE)",
        description=run.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("file", type=Path, help="RolloutJob YAML")
    p.add_argument("--trajectories", type=int, default=256, help="trajectories to run (whole groups)")
    p.add_argument("--workers-per-pool", type=int, default=2, help="simulated engines per pool at most")
    p.add_argument("--env-servers", type=int, default=2)
    p.add_argument("--max-tokens", type=int, default=128, help="tokens per turn at most")
    p.add_argument("--max-in-flight", type=int, default=256)
    p.add_argument(
        "--max-num-seqs", type=int, default=256, help="sequences each simulated engine runs at once"
    )
    p.add_argument("--engine-step-ms", type=float, default=0.0, help="simulated time per decode step")
    p.add_argument(
        "--rebalance-interval", type=float,
        help="seconds between inter-agent rebalance polls (0: never); default: the job's "
        "spec.rollout.rebalance",
    )  # fmt: skip
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--redis",
        default="",
        help="Redis URL for the buffer and the job's API quotas (default: embedded memory store, no quotas)",
    )
    p.add_argument(
        "--run-dir", type=Path, default=None, help="logs and summary.json (default: under the cache)"
    )
    p.add_argument("--interval", type=float, default=1.0, help="seconds between progress lines")
    p.add_argument("--timeout", type=float, default=900.0, help="give up after this many seconds")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        job = v1alpha1.parse_job(yaml.safe_load(args.file.read_text()))
        options = plan.Options(
            trajectories=args.trajectories, max_workers_per_pool=args.workers_per_pool,
            env_servers=args.env_servers, max_tokens=args.max_tokens, max_in_flight=args.max_in_flight,
            max_num_seqs=args.max_num_seqs, engine_step_ms=args.engine_step_ms,
            rebalance_interval_s=args.rebalance_interval, seed=args.seed,
        )  # fmt: skip
        run_dir = args.run_dir or run.default_run_dir(job.name)
        summary = asyncio.run(
            until_signalled(
                run.run(job, options, run_dir=run_dir, redis_url=args.redis, interval_s=args.interval,
                        timeout_s=args.timeout)
            )
        )  # fmt: skip
    except Stopped as exc:
        print(
            f"treadle run: stopped by {exc.signal.name}; every service process was stopped", file=sys.stderr
        )
        return 128 + exc.signal.value
    except errors.SpecError as exc:
        print(f"treadle run: {args.file}: {exc}", file=sys.stderr)
        return 2
    except (OSError, yaml.YAMLError, stack.StartFailed) as exc:
        print(f"treadle run: {exc}", file=sys.stderr)
        return 1
    return 0 if summary["unfinished"] == 0 and summary["adds_up"] else 1
