"""The reference trainer's step throughput: 1 rank against N ranks of FSDP2, side by side in one run.

Measured, not simulated: each configuration runs this file under ``torchrun`` (real
torch.distributed: gloo on CPU, NCCL on GPUs) over a generated Llama, trains ``--steps`` GRPO
steps of the reference trainer (``treadle.trainer.group.Group``: the sharded step and the sharded
publication of the weights and Adam's state to a FileStore under ``--out``) on a synthetic batch,
and reports per configuration:

- tokens/s: prompt + output tokens of the batch per second of the training phase (mean over the
  steps after the first, which pays for allocations);
- publish seconds: the weights and Adam's state, every rank its own rows, up to the manifest;
- peak RSS of the largest rank (CPU) or peak CUDA memory of rank 0 (GPU), in GiB;
- on a GPU, MFU: ``6 * parameters * tokens / seconds`` over the device's dense bf16 peak
  (``--peak-tflops``, 989 for an H100/H200 SXM).

CPU: ``python bench/trainer_throughput.py --ranks 1 2`` (a 4-layer 512-wide Llama, float32, one
thread per rank). GPU: ``python bench/trainer_throughput.py --ranks 1 --hidden 2048 --layers 16
--bf16`` (a ~1B config). Results go to ``--out`` (results.json) and to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any


def batch(groups: int, group_size: int, prompt: int, output: int, vocab: int) -> Any:
    from treadle.client import batches

    samples = []
    for i in range(groups * group_size):
        ids = tuple((7 * i + j) % (vocab - 10) + 5 for j in range(prompt))
        out = tuple((11 * i + 3 * j) % (vocab - 10) + 5 for j in range(output))
        turn = batches.Turn(ids, out, tuple(-3.0 for _ in out), (0,) * len(out))
        samples.append(
            batches.Sample(f"t{i}", f"g{i // group_size}", "bench", float(i % 3), 0, 0, 0, (turn,))
        )
    return batches.TrainBatch("bench", tuple(samples), 0)


def worker(a: argparse.Namespace) -> None:
    import torch

    from treadle.models import tiny
    from treadle.trainer import checkpoint, group, parallel, policy, step
    from treadle.weights import objects, publish

    torch.set_num_threads(1)
    world = parallel.init()
    try:
        model_dir = Path(a.out) / f"model-{a.hidden}x{a.layers}"
        if world.rank == 0 and not (model_dir / "treadle-model.json").exists():
            tiny.generate(model_dir, hidden=a.hidden, layers=a.layers, vocab_size=a.vocab)
        parallel.all_sum([0.0], world)  # a barrier: the model is written
        pol = policy.load(model_dir)
        params = sum(p.numel() for p in pol.model.parameters())
        parallel.shard(pol.model, world, bf16=a.bf16, checkpointing=a.checkpointing)
        store = objects.FileStore(Path(a.out) / f"store-{world.size}")
        prefix = "bench/trainer"
        weights = publish.Publisher(store, prefix, bucket_bytes=64 << 20, staleness_window=1)
        learner = group.Group(
            world, pol, lr=1e-5, settings=step.Settings(micro_batch_tokens=a.micro_tokens), weights=weights,
            optimizer_store=checkpoint.OptimizerStore(store, prefix, keep_versions=2),
        )  # fmt: skip
        work = batch(a.groups, a.group_size, a.prompt, a.output, a.vocab)
        train_s, publish_s, tokens = [], [], 0
        if world.leader:
            for version in range(1, a.steps + 1):
                done = learner.step(work, version)
                train_s.append(done.train_s)
                publish_s.append(done.publish_s)
                tokens = done.stats.tokens
            learner.stop()
        else:
            learner.follow()
        if torch.cuda.is_available():
            peak = torch.cuda.max_memory_allocated() / 2**30
        else:
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        peaks = parallel.all_gather(peak, world)
        if world.leader:
            warm = train_s[1:] or train_s
            seconds = sum(warm) / len(warm)
            result = {
                "ranks": world.size, "device": world.device.type, "params": params, "tokens_per_step": tokens,
                "train_s": round(seconds, 4), "tokens_per_s": round(tokens / seconds, 1),
                "publish_s": round(sum(publish_s[1:] or publish_s) / len(publish_s[1:] or publish_s), 4),
                "peak_gib": round(max(peaks), 3),
                "mfu": round(6 * params * tokens / seconds / (a.peak_tflops * 1e12), 4)
                if world.device.type == "cuda" else None,
            }  # fmt: skip
            print("RESULT " + json.dumps(result), flush=True)
    finally:
        parallel.close()


def launch(a: argparse.Namespace, ranks: int) -> dict[str, Any]:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = [x for x in sys.argv[1:] if x != "--worker"]
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={ranks}",
           "--master-addr=127.0.0.1", f"--master-port={port}", __file__, "--worker", *argv]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    lines = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"{ranks} rank(s) failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    result: dict[str, Any] = json.loads(lines[-1].removeprefix("RESULT "))
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--groups", type=int, default=4)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--prompt", type=int, default=64)
    p.add_argument("--output", type=int, default=128)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--micro-tokens", type=int, default=None)
    p.add_argument("--bf16", action="store_true")
    p.add_argument("--checkpointing", action="store_true")
    p.add_argument("--peak-tflops", type=float, default=989.0)
    p.add_argument("--out", default=None)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        worker(a)
        return
    out = Path(a.out or tempfile.mkdtemp(prefix="trainer-throughput-"))
    out.mkdir(parents=True, exist_ok=True)
    if a.out is None:
        sys.argv += ["--out", str(out)]
    results = [launch(a, ranks) for ranks in a.ranks]
    config = {k: v for k, v in vars(a).items() if k != "worker"} | {"out": str(out)}
    print(
        f"model {results[0]['params'] / 1e6:.1f}M parameters, {results[0]['tokens_per_step']} tokens per step"
    )
    head = ("ranks", "device", "tokens/s", "train s", "publish s", "peak GiB", "MFU")
    print(" ".join(f"{h:>{w}}" for h, w in zip(head, (5, 6, 10, 8, 9, 8, 6), strict=True)))
    for r in results:
        mfu = f"{r['mfu']:.3f}" if r["mfu"] is not None else "-"
        print(f"{r['ranks']:>5} {r['device']:>6} {r['tokens_per_s']:>10.1f} {r['train_s']:>8.3f} "
              f"{r['publish_s']:>9.3f} {r['peak_gib']:>8.3f} {mfu:>6}")  # fmt: skip
    (out / "results.json").write_text(json.dumps({"config": config, "results": results}, indent=2))
    print(f"results in {out / 'results.json'}")


if __name__ == "__main__":
    main()
