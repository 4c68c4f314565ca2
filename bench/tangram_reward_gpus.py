"""Reward-model restores from host memory, measured: the gateway's ``SimulatedEngines.restore`` copies
each GPU's shard of a model's host-memory backup (real bytes, ``--weights-gb`` of them) for degrees
1, 2, 4 and 8, ``--repeats`` times each, and prints the median seconds and GB/s per degree.

On a CPU machine the "GPU memory" is host memory too, so this is a host-to-host copy (this
machine's memory bandwidth): the figure a GPU restore would take (PCIe / NVLink host-to-device) is
not measured here. The simulated engine processes are started before timing (one per variant).

Run: ``python bench/tangram_reward_gpus.py [--weights-gb 1.0]``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import statistics

import benchcli

from treadle.api import v1alpha1
from treadle.policy.tangram import buddy
from treadle.services.reward import engines


@dataclasses.dataclass
class Config:
    weights_gb: float = dataclasses.field(default=1.0, metadata={"help": "the model's weights (GB)"})
    repeats: int = dataclasses.field(default=5, metadata={"help": "restores timed per degree"})


async def run(cfg: Config) -> None:
    rm = v1alpha1.RewardModel(
        name="judge", model="judge", weights_gb=cfg.weights_gb, parallelism=[1, 2, 4, 8]
    )
    simulated = engines.SimulatedEngines([rm])
    try:
        print(f"load {os.getloadavg()[0]:.1f}; weights {cfg.weights_gb} GB; host-to-host copies (module doc)")
        print("degree  shard GB  median s  GB/s (all shards, copied one after another)")
        for degree in (1, 2, 4, 8):
            chunk = buddy.Chunk(0, 0, degree)
            times = []
            for _ in range(cfg.repeats):
                times.append(await simulated.restore(rm, degree, chunk))
                simulated.evict(rm.name, degree, chunk)
            median = statistics.median(times)
            shard, rate = cfg.weights_gb / degree, cfg.weights_gb / median
            print(f"{degree:>6}  {shard:>8.3f}  {median:>8.4f}  {rate:>8.2f}")
    finally:
        await simulated.aclose()


def main() -> None:
    asyncio.run(run(benchcli.parse(Config, __doc__)))


if __name__ == "__main__":
    main()
