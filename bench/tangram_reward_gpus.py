"""Reward-model restores from host memory, measured: the gateway's ``SimulatedEngines.restore`` copies
each GPU's shard of a model's host-memory backup (real bytes, ``--weights-gb`` of them) for degrees
1, 2, 4 and 8, ``--repeats`` times each, and prints the median seconds and GB/s per degree.

On a CPU machine the "GPU memory" is host memory too, so this is a host-to-host copy (this
machine's memory bandwidth): the figure a GPU restore would take (PCIe / NVLink host-to-device) is
not measured here. The simulated engine processes are started before timing (one per variant).

``--engine vllm``: REAL vLLM (the CPU build) instead, serving a generated random Llama of
``--hidden`` x ``--layers`` at degree 1; ``VllmEngines.restore`` reloads its weights from the copy in
``/dev/shm`` (the worker extension's ``treadle_weights_restore``: checked, then ``reload_weights``).
The engine's start is not timed. Again no GPU: a reload into host memory, not a wake-up and a copy
to the device.

Run: ``python bench/tangram_reward_gpus.py [--weights-gb 1.0] [--engine vllm --hidden 1024 --layers 8]``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import benchcli

from treadle import errors
from treadle.api import v1alpha1
from treadle.models import tiny, vllm_server
from treadle.policy.tangram import buddy
from treadle.services.reward import engines


@dataclasses.dataclass
class Config:
    weights_gb: float = dataclasses.field(default=1.0, metadata={"help": "the model's weights (GB)"})
    repeats: int = dataclasses.field(default=5, metadata={"help": "restores timed per degree"})
    engine: str = dataclasses.field(default="simulated", metadata={"help": "simulated, or vllm (module doc)"})
    hidden: int = dataclasses.field(default=1024, metadata={"help": "vllm: the generated model's width"})
    layers: int = dataclasses.field(default=8, metadata={"help": "vllm: the generated model's layers"})


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


async def run_vllm(cfg: Config, tmp: Path, shm: Path) -> None:
    model = tiny.generate(tmp / "judge", hidden=cfg.hidden, layers=cfg.layers)
    size_gb = sum(f.stat().st_size for f in model.glob("*.safetensors")) / 1e9
    rm = v1alpha1.RewardModel(
        name="judge", model=str(model), weights_gb=size_gb, engine="vllm",
        engine_args=["--enforce-eager", "--max-model-len", "512", "--max-num-seqs", "2"],
    )  # fmt: skip
    environ = {**os.environ, **vllm_server.environment(tmp / "vllm-cache")}
    real = engines.VllmEngines([rm], backup_dir=shm, gpu_gb=80.0, cuda=False, environ=environ)
    chunk = buddy.Chunk(0, 0, 1)
    try:
        began = time.monotonic()
        while True:  # the first restore starts the engine: Unavailable until it is up
            try:
                await real.restore(rm, 1, chunk)
                break
            except errors.Unavailable:
                if time.monotonic() - began > 900:
                    raise
                await asyncio.sleep(2.0)
        up_s, load = time.monotonic() - began, os.getloadavg()[0]
        print(f"REAL vLLM (CPU build), {cfg.hidden} x {cfg.layers} random Llama, {size_gb:.3f} GB of "
              f"safetensors; engine up in {up_s:.0f} s; load {load:.1f}")  # fmt: skip
        times = []
        for _ in range(cfg.repeats):
            real.evict(rm.name, 1, chunk)
            times.append(await real.restore(rm, 1, chunk))
        median = statistics.median(times)
        print(
            f"restores: {[round(t, 3) for t in times]} s; median {median:.3f} s, {size_gb / median:.2f} GB/s"
        )
    finally:
        await real.aclose()


def main() -> None:
    cfg = benchcli.parse(Config, __doc__)
    if cfg.engine == "simulated":
        asyncio.run(run(cfg))
        return
    if cfg.engine != "vllm":
        raise SystemExit(f"--engine: simulated or vllm, got {cfg.engine!r}")
    tmp, shm = Path(tempfile.mkdtemp()), Path(tempfile.mkdtemp(dir="/dev/shm"))
    try:
        asyncio.run(run_vllm(cfg, tmp, shm))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(shm, ignore_errors=True)


if __name__ == "__main__":
    main()
