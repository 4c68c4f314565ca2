"""One rank of the numerics test, under ``torchrun``: one GRPO step of the sharded reference trainer.

``python -m torch.distributed.run --nproc-per-node N fsdp_worker.py MODEL STORE [MICRO_TOKENS]``:
loads the tiny model, shards it over the ranks, trains one step on ``batch()`` and publishes the
result as version 1 under ``PREFIX`` in the FileStore at STORE, every rank its own rows (weights and
Adam's state); rank 0 prints the step's statistics as one JSON line.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import torch

from treadle.client import batches
from treadle.trainer import checkpoint, group, parallel, policy, step
from treadle.weights import objects, publish

PREFIX = "numerics/fsdp"
LR = 1e-3
"""Adam's first step moves each weight by about LR whatever its gradient's size, so float noise in a
gradient near 0 shows in the weights in proportion to LR: 1e-2 gave 1.6e-5, 1e-3 stays inside 1e-5."""


def batch() -> batches.TrainBatch:
    """Three groups of two, outputs of 1 to 9 tokens after prompts of 3 to 6: uneven on purpose."""
    samples = []
    for i in range(6):
        prompt = tuple(range(10 + i, 13 + i + i % 4))
        output = tuple(100 + (7 * i + j) % 50 for j in range(1 + (5 * i) % 9))
        turn = batches.Turn(
            prompt, output, tuple(-4.0 - 0.1 * j for j in range(len(output))), (0,) * len(output)
        )
        samples.append(batches.Sample(f"t{i}", f"g{i // 2}", "toy", float(i % 3) / 2, 0, 0, 0, (turn,)))
    return batches.TrainBatch("b0", tuple(samples), 0)


def main() -> None:
    model, store_dir = Path(sys.argv[1]), Path(sys.argv[2])
    micro = int(sys.argv[3]) if len(sys.argv) > 3 else None
    torch.manual_seed(0)
    torch.set_num_threads(1)
    world = parallel.init()
    try:
        pol = policy.load(model)
        parallel.shard(pol.model, world, bf16=False, checkpointing=False)
        store = objects.FileStore(store_dir)
        weights = publish.Publisher(store, PREFIX, bucket_bytes=1 << 16)  # several buckets per rank
        learner = group.Group(
            world, pol, lr=LR, settings=step.Settings(micro_batch_tokens=micro), weights=weights,
            optimizer_store=checkpoint.OptimizerStore(store, PREFIX, keep_versions=2),
        )  # fmt: skip
        if world.leader:
            done = learner.step(batch(), 1)
            learner.stop()
            print(
                json.dumps({"stats": dataclasses.asdict(done.stats), "buckets": len(done.manifest.buckets)})
            )
        else:
            learner.follow()
    finally:
        parallel.close()


if __name__ == "__main__":
    main()
