"""Weight publication throughput on loopback: publish and pull GiB/s beside a memory-copy baseline.

Measured, not simulated: a real mooncake_master and real store processes on 127.0.0.1 (or the
local /dev/shm FileStore), the trainer a pure client, the reader in this process too. For each
weight size it reports

- the memory-copy baseline of this machine, measured in the same run: ``np.copyto`` between two
  pre-touched buffers (hot) and into freshly allocated memory (cold: page faults included, which
  every fresh pull and first-touched store segment pays too);
- publish: pack tensors into buckets + xxh3 + put to every replica + manifest, GiB of weights/s;
- pull: manifest + get every bucket into one fresh buffer + xxh3 validation, GiB of weights/s;
- prefetch overlap: a pull started when "generation" starts, with generation emulated by a sleep
  (GPU-bound decode leaves host cores idle; on this 2-core box a real CPU vLLM would compete for
  them). Exposed = what remains of the pull once generation ends, as RollArt Table 4 reports it.

Run: ``python bench/weights_publish.py --sizes-gib 1 8``. Results go to ``--out`` (config.json,
results.json) and to stdout. A size whose working set does not fit in MemAvailable gets fewer
replicas (said in the output) or is skipped. The check is made once, at the start of each size:
on a shared machine run the large sizes alone (an 8 GiB run was OOM-killed here when other
workloads grew meanwhile). First-touch page faults dominate cold rounds on VMs (seconds per GiB),
which is why round 0 is reported apart from the warm ones.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import benchcli
import numpy as np

from treadle.testing import mooncake_master as mooncake_master_mod
from treadle.weights import layout, mooncake_client, objects, publish, pull, store

GIB = 1 << 30
# RollArt Table 4 (seconds): accumulated vs exposed pull, 8B / 14B / 32B.
ROLLART_TABLE4 = {"8B": (6.2, 1.4), "14B": (16.3, 5.1), "32B": (29.7, 9.6)}


@dataclasses.dataclass
class Config:
    sizes_gib: list[float] = dataclasses.field(
        default_factory=lambda: [1.0, 8.0], metadata={"help": "weight sizes"}
    )
    backend: str = dataclasses.field(
        default="mooncake", metadata={"help": "mooncake or local (/dev/shm files)"}
    )
    replicas: int = dataclasses.field(
        default=2, metadata={"help": "wanted replicas (reduced if RAM is short)"}
    )
    stores: int = dataclasses.field(default=2, metadata={"help": "store processes (mooncake)"})
    bucket_mib: int = dataclasses.field(default=1024, metadata={"help": "bucket size"})
    tensor_mib: int = dataclasses.field(default=64, metadata={"help": "size of each synthetic tensor"})
    trials: int = dataclasses.field(
        default=3, metadata={"help": "publish+pull rounds per size (1st is cold)"}
    )
    overlap_ratios: list[float] = dataclasses.field(
        default_factory=lambda: [0.5, 1.0, 1.5], metadata={"help": "emulated generation time / pull time"}
    )
    seed: int = dataclasses.field(default=0, metadata={"help": "RNG seed of the synthetic weights"})
    out: str = dataclasses.field(
        default=str(Path.home() / ".cache/treadle/bench/weights_publish"), metadata={"help": "output dir"}
    )


def mem_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no MemAvailable in /proc/meminfo")


def copy_baseline(nbytes: int) -> dict[str, float]:
    src = np.ones(nbytes, dtype=np.uint8)
    dst = np.zeros(nbytes, dtype=np.uint8)
    np.copyto(dst, src)
    t = time.perf_counter()
    np.copyto(dst, src)
    hot = time.perf_counter() - t
    del dst
    t = time.perf_counter()
    fresh = np.empty(nbytes, dtype=np.uint8)
    np.copyto(fresh, src)
    cold = time.perf_counter() - t
    return {"copy_hot_gibps": nbytes / GIB / hot, "copy_cold_gibps": nbytes / GIB / cold}


def synthetic_state(nbytes: int, tensor_bytes: int, seed: int) -> dict[str, np.ndarray]:
    """``nbytes`` of float32 tensors that are views of one random block, to spare the trainer RAM."""
    block = np.random.default_rng(seed).standard_normal(tensor_bytes // 4).astype(np.float32)
    n, rest = divmod(nbytes, tensor_bytes)
    state = {f"layers.{i}.weight": block for i in range(n)}
    if rest:
        state["tail"] = block[: rest // 4]
    return state


@contextlib.contextmanager
def backend(
    cfg: Config, size: int, replicas: int
) -> Iterator[tuple[objects.ObjectStore, objects.ObjectStore]]:
    """(trainer store, reader store) for one size; Mooncake gets fresh stores sized for it."""
    if cfg.backend == "local":
        root = Path("/dev/shm/treadle-bench-weights")
        yield objects.FileStore(root), objects.FileStore(root)
        objects.FileStore(root).remove_dir("bench")
        return
    per_store = -(-size * replicas // cfg.stores) + cfg.bucket_mib * (1 << 20) * 2
    with contextlib.ExitStack() as stack:
        master = stack.enter_context(mooncake_master_mod.mooncake_master())
        for _ in range(cfg.stores):
            stack.enter_context(
                store.spawned(
                    master.master_address, master.metadata_url, segment=f"{per_store >> 20}MiB", timeout=120
                )
            )
        conf = mooncake_client.MooncakeConfig(master.master_address, master.metadata_url, replicas=replicas)
        trainer, reader = mooncake_client.MooncakeStore(conf), mooncake_client.MooncakeStore(conf)
        try:
            yield trainer, reader
        finally:
            trainer.close()
            reader.close()


def delete_version(target: objects.ObjectStore, version: int) -> None:
    target.remove(layout.manifest_key("bench", version))
    target.remove_dir(layout.version_dir("bench", version))


def plan_replicas(cfg: Config, size: int) -> int:
    """Most replicas <= cfg.replicas whose working set fits: stores + reader buffer + trainer block."""
    if cfg.backend == "local":
        return 1
    headroom = 2 * GIB + cfg.bucket_mib * (1 << 20) * 2
    for r in range(cfg.replicas, 0, -1):
        if size * r + size + headroom <= mem_available():
            return r
    return 0


def run_size(cfg: Config, size_gib: float) -> dict[str, Any]:
    size = int(size_gib * GIB)
    replicas = plan_replicas(cfg, size)
    result: dict[str, Any] = {"size_gib": size_gib, "replicas": replicas, **copy_baseline(min(size, GIB))}
    if replicas == 0:
        result["skipped"] = f"needs > {mem_available() / GIB:.1f} GiB available"
        return result
    state = synthetic_state(size, cfg.tensor_mib << 20, cfg.seed)
    rounds = []
    with backend(cfg, size, replicas) as (trainer, reader_store):
        pub = publish.Publisher(trainer, "bench", bucket_bytes=cfg.bucket_mib << 20, staleness_window=0)
        reader = pull.Reader(reader_store, "bench", deadline_s=120)
        version = 0
        reuse: objects.Bytes | None = None  # round 0 pulls into fresh memory, later rounds reuse it
        for trial in range(cfg.trials):
            version += 1
            t = time.perf_counter()
            manifest = pub.publish(state, version)
            publish_s = time.perf_counter() - t
            t = time.perf_counter()
            snap = reader.pull(version, out=reuse)
            pull_s = time.perf_counter() - t
            assert snap.manifest.total_bytes >= size
            reuse = snap.buffer
            del snap
            if trial + 1 < cfg.trials:  # free the stores before the next round: RAM is the limit here
                delete_version(trainer, version)
            rounds.append({"trial": trial, "buckets": len(manifest.buckets), "publish_s": publish_s,
                           "pull_s": pull_s, "publish_gibps": size / GIB / publish_s,
                           "pull_gibps": size / GIB / pull_s})  # fmt: skip
        overlap = []
        warm_pull_s = rounds[-1]["pull_s"]
        for ratio in cfg.overlap_ratios:
            gen_s = ratio * warm_pull_s
            t = time.perf_counter()
            future = reader.prefetch(version, out=reuse)
            time.sleep(gen_s)  # emulated generation
            gen_end = time.perf_counter()
            snap = future.result()
            exposed = time.perf_counter() - gen_end
            overlap.append({"gen_over_pull": ratio, "gen_s": gen_s, "total_pull_s": snap.fetch_s,
                            "exposed_s": exposed, "exposed_fraction": exposed / snap.fetch_s,
                            "wall_s": time.perf_counter() - t})  # fmt: skip
            del snap
        reader.close()
        delete_version(trainer, version)
        pub.close()
    result["rounds"] = rounds
    result["overlap"] = overlap
    return result


def report(results: list[dict[str, Any]], cfg: Config) -> None:
    print(
        f"backend={cfg.backend} bucket={cfg.bucket_mib} MiB tensor={cfg.tensor_mib} MiB cpus={os.cpu_count()}"
    )
    print(
        f"{'size':>6} {'rep':>3} {'copy hot':>9} {'copy cold':>9} {'trial':>5} {'publish':>14} {'pull':>14}"
    )
    for r in results:
        if "skipped" in r:
            print(f"{r['size_gib']:>5}G  skipped: {r['skipped']}")
            continue
        for rd in r["rounds"]:
            print(
                f"{r['size_gib']:>5}G {r['replicas']:>3} "
                f"{r['copy_hot_gibps']:>7.2f}/s {r['copy_cold_gibps']:>7.2f}/s "
                f"{rd['trial']:>5} {rd['publish_gibps']:>6.2f} GiB/s {rd['publish_s']:>5.1f}s"
                f" {rd['pull_gibps']:>5.2f} GiB/s {rd['pull_s']:>5.1f}s"
            )
        for o in r["overlap"]:
            print(
                f"       prefetch overlap, generation = {o['gen_over_pull']:.1f} x pull: total pull "
                f"{o['total_pull_s']:.2f}s, exposed {o['exposed_s']:.2f}s "
                f"({100 * o['exposed_fraction']:.0f}%)"
            )
    paper = ", ".join(f"{m} {e / a:.0%}" for m, (a, e) in ROLLART_TABLE4.items())
    print(f"RollArt Table 4 exposed/accumulated pull (paper, cross-cluster, real rollout): {paper}")


def main() -> None:
    cfg = benchcli.parse(Config, __doc__)
    out = Path(cfg.out) / time.strftime("%Y%m%dT%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(dataclasses.asdict(cfg), indent=2))
    results = [run_size(cfg, s) for s in cfg.sizes_gib]
    (out / "results.json").write_text(json.dumps(results, indent=2))
    report(results, cfg)
    print(f"written to {out}")


if __name__ == "__main__":
    main()
