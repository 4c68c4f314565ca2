"""A weight swap on a real GPU through Treadle's own weights code: publish -> prefetch -> apply, per stage.

For a bf16 state dict shaped like a Llama model (names and shapes of Hugging Face's Llama, built
from a small config sized to ``--params``; random values made directly on ``--device``), each
stage of the path a trainer and a vLLM worker take is timed:

- publish: ``treadle.weights.publish.Publisher.publish`` of the GPU tensors into a local-directory
  ``treadle.weights.objects.FileStore``: device-to-host copy (``tensors.flatten``), packing into
  1 GiB buckets, xxh3-128 of each, file writes, manifest commit, gc of the previous version;
- prefetch: ``treadle.weights.loader.Loader.prefetch`` until done, i.e. ``pull.Reader.pull`` on the
  loader's background thread: manifest, every bucket read into one (reused) host buffer, each
  bucket's xxh3-128 checked against the manifest, tensors rebuilt as zero-copy torch views;
- apply: ``Loader.apply`` of the prefetched version: the names/shapes check against the served
  checkpoint's spec, then ``load``, which here calls ``load_weights`` of a TORCH STAND-IN, not vLLM:
  a module whose parameters live on the device and whose ``load_weights`` copies each pulled tensor
  into them with ``param.data.copy_`` (host-to-device), stacking q/k/v into ``qkv_proj`` and
  gate/up into ``gate_up_proj`` the way vLLM's Llama ``load_weights`` does. In vLLM the extension's
  ``load`` calls ``model_runner.reload_weights``, which ends in those same per-parameter copies plus
  vLLM's own bookkeeping (and, on CPU builds only, a GEMM repack), which the stand-in lacks.

prefetch and apply are measured for each pull buffer ``--pinned`` names, side by side on the same
published versions: ``pageable`` (``pull.pageable``, plain numpy memory, the reader's default) and
``pinned`` (``pull.pinned``, page-locked by torch, what the vLLM extension uses on a CUDA engine;
pageable again where CUDA is absent). One loader per buffer kind; each version is published once,
then every loader prefetches and applies it, in alternating order from version to version. The
warm-up version's prefetch is reported too (``first prefetch``): it allocates the buffer, which
every later version reuses.

Baselines of the same bytes, measured in the same run: ``.cpu()`` of the tensors (device-to-host
into fresh pageable memory, what ``tensors.flatten`` does), copy into pre-allocated pinned host
memory, host-to-device ``copy_`` from pinned and from pageable memory, a host memcpy
(``np.copyto``, pre-touched buffers), xxh3-128 of the bytes, and a plain write/read of 1 GiB files
in the store's directory. Each timing is one warm-up then ``--repeats`` runs: median and min, GB/s
with GB = 1e9 bytes. Figures only: nothing here asserts a speed.

Run: ``python bench/weights_gpu_swap.py --device cuda`` (sizes 1e9 and 2.5e8 parameters by default);
a CPU smoke test: ``python bench/weights_gpu_swap.py --params 2e6 --device cpu``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import platform
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, NoReturn

import benchcli
import numpy as np
import torch

from treadle.weights import layout, loader, objects, publish, pull

GB = 1e9
PREFIX = "bench-gpu-swap"


@dataclasses.dataclass
class Config:
    params: list[float] = dataclasses.field(
        default_factory=lambda: [1e9, 2.5e8], metadata={"help": "model sizes, in parameters (bf16)"}
    )
    device: str = dataclasses.field(default="cuda", metadata={"help": "cuda or cpu (a smoke test)"})
    stores: str = dataclasses.field(
        default="shm,disk",
        metadata={"help": "comma-separated FileStore roots to measure: shm (/dev/shm), disk (--disk-dir)"},
    )
    disk_dir: str = dataclasses.field(
        default=tempfile.gettempdir(), metadata={"help": "where the 'disk' store makes its tmp dir"}
    )
    bucket_mib: int = dataclasses.field(
        default=publish.DEFAULT_BUCKET_BYTES >> 20, metadata={"help": "publisher bucket size"}
    )
    repeats: int = dataclasses.field(default=3, metadata={"help": "timed runs after one warm-up"})
    pinned: str = dataclasses.field(
        default="both",
        metadata={"help": "pull buffer for prefetch/apply: both (side by side), on (pinned), off (pageable)"},
    )
    seed: int = dataclasses.field(default=0, metadata={"help": "RNG seed of the random weights"})
    json_out: str = dataclasses.field(default="", metadata={"help": "also write the results here (JSON)"})


# ---------------------------------------------------------------------------------------- model shapes


@dataclasses.dataclass(frozen=True)
class LlamaShape:
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def tensors(self) -> list[tuple[str, tuple[int, ...]]]:
        """Hugging Face Llama names and shapes (untied lm_head), in checkpoint order."""
        h, kv = self.hidden, self.kv_heads * self.head_dim
        out: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (self.vocab, h))]
        for i in range(self.layers):
            p = f"model.layers.{i}"
            out += [
                (f"{p}.input_layernorm.weight", (h,)),
                (f"{p}.self_attn.q_proj.weight", (h, h)),
                (f"{p}.self_attn.k_proj.weight", (kv, h)),
                (f"{p}.self_attn.v_proj.weight", (kv, h)),
                (f"{p}.self_attn.o_proj.weight", (h, h)),
                (f"{p}.post_attention_layernorm.weight", (h,)),
                (f"{p}.mlp.gate_proj.weight", (self.intermediate, h)),
                (f"{p}.mlp.up_proj.weight", (self.intermediate, h)),
                (f"{p}.mlp.down_proj.weight", (h, self.intermediate)),
            ]
        out += [("model.norm.weight", (h,)), ("lm_head.weight", (self.vocab, h))]
        return out

    def count(self) -> int:
        return sum(int(np.prod(s)) for _, s in self.tensors())


def llama_shape(params: float) -> LlamaShape:
    """A Llama-like config (GQA 4:1, head dim 64-128, MLP 2.6875 x hidden) with about ``params``."""
    if params >= 5e8:
        hidden, vocab = 2048, 32000
    elif params >= 1e8:
        hidden, vocab = 1024, 32000
    elif params >= 1e7:
        hidden, vocab = 512, 8192
    else:
        hidden, vocab = 128, 2048
    heads = max(2, hidden // 64)
    intermediate = -(-int(hidden * 2.6875) // 64) * 64
    one_layer = LlamaShape(hidden, intermediate, 1, heads, heads // 4 or 1, vocab)
    per_layer = LlamaShape(hidden, intermediate, 2, heads, heads // 4 or 1, vocab).count() - one_layer.count()
    fixed = one_layer.count() - per_layer
    layers = max(1, round((params - fixed) / per_layer))
    return dataclasses.replace(one_layer, layers=layers)


def random_state(shape: LlamaShape, device: torch.device, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator(device=device).manual_seed(seed)
    return {
        name: torch.randn(s, dtype=torch.bfloat16, device=device, generator=gen) * 0.02
        for name, s in shape.tensors()
    }


# ------------------------------------------------------------------------------------ torch stand-in


class TorchStandIn:
    """NOT vLLM: parameters on ``device`` and a ``load_weights`` that copies into them like vLLM's Llama.

    vLLM keeps q/k/v in one ``qkv_proj`` and gate/up in one ``gate_up_proj`` parameter and its
    ``LlamaForCausalLM.load_weights`` routes each checkpoint tensor to its shard with
    ``param.data.copy_`` (``default_weight_loader`` for the rest). This does the same copies, on one
    device (tensor parallelism 1), with none of vLLM's engine around it.
    """

    STACKED = (  # (packed name, checkpoint name, shard index)
        (".qkv_proj", ".q_proj", 0), (".qkv_proj", ".k_proj", 1), (".qkv_proj", ".v_proj", 2),
        (".gate_up_proj", ".gate_proj", 0), (".gate_up_proj", ".up_proj", 1),
    )  # fmt: skip

    def __init__(self, shape: LlamaShape, device: torch.device) -> None:
        self.device = device
        self.params: dict[str, torch.Tensor] = {}
        # (packed name, shard) -> row offset and rows inside the packed parameter.
        self.shards: dict[tuple[str, int], tuple[int, int]] = {}
        pending: dict[str, list[tuple[int, tuple[int, ...]]]] = {}
        for name, s in shape.tensors():
            packed = self._packed(name)
            if packed is None:
                self.params[name] = torch.empty(s, dtype=torch.bfloat16, device=device)
            else:
                pending.setdefault(packed[0], []).append((packed[1], s))
        for packed_name, parts in pending.items():
            row = 0
            for shard, s in sorted(parts):
                self.shards[packed_name, shard] = (row, s[0])
                row += s[0]
            self.params[packed_name] = torch.empty((row, parts[0][1][1]), dtype=torch.bfloat16, device=device)

    def _packed(self, name: str) -> tuple[str, int] | None:
        for packed, part, shard in self.STACKED:
            if part in name:
                return name.replace(part, packed), shard
        return None

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Copy every (name, host tensor) into its parameter; returns the parameters written."""
        loaded: set[str] = set()
        for name, w in weights:
            packed = self._packed(name)
            if packed is None:
                self.params[name].data.copy_(w)
                loaded.add(name)
            else:
                row, rows = self.shards[packed]
                self.params[packed[0]].data.narrow(0, row, rows).copy_(w)
                loaded.add(packed[0])
        return loaded


# ------------------------------------------------------------------------------------------- timing


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclasses.dataclass
class Timing:
    what: str
    nbytes: int
    samples: list[float]
    note: str = ""

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def best(self) -> float:
        return min(self.samples)

    @property
    def gbps(self) -> float:
        return self.nbytes / GB / self.median

    def row(self) -> dict[str, Any]:
        return {"what": self.what, "bytes": self.nbytes, "median_s": self.median, "min_s": self.best,
                "gbps_median": self.gbps, "gbps_best": self.nbytes / GB / self.best,
                "samples_s": self.samples, "note": self.note}  # fmt: skip


def timed(
    what: str,
    nbytes: int,
    fn: Callable[[], object],
    device: torch.device,
    repeats: int,
    *,
    setup: Callable[[], object] | None = None,
    note: str = "",
) -> Timing:
    """One warm-up, then ``repeats`` timed calls; ``setup`` (untimed) runs before each call."""
    samples = []
    for i in range(1 + repeats):
        if setup is not None:
            setup()
        sync(device)
        start = time.perf_counter()
        fn()
        sync(device)
        if i > 0:
            samples.append(time.perf_counter() - start)
    return Timing(what, nbytes, samples, note)


# ------------------------------------------------------------------------------------------- stores


def fs_info(path: Path) -> str:
    """Filesystem type and free space of ``path`` (the longest /proc/mounts entry above it)."""
    best, fstype = "", "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/mounts").read_text().splitlines():
            parts = line.split()
            mnt = parts[1]
            if str(path.resolve()).startswith(mnt) and len(mnt) > len(best):
                best, fstype = mnt, parts[2]
    usage = shutil.disk_usage(path)
    return f"{fstype} mounted at {best or '?'}, {usage.free / GB:.1f} GB free of {usage.total / GB:.1f} GB"


@contextlib.contextmanager
def store_root(kind: str, cfg: Config) -> Iterator[Path]:
    if kind == "shm":
        base = Path("/dev/shm")
    elif kind == "disk":
        base = Path(cfg.disk_dir)
    else:
        raise SystemExit(f"unknown store {kind!r}: use shm or disk")
    root = Path(tempfile.mkdtemp(prefix="treadle-gpu-swap-", dir=base))
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


# --------------------------------------------------------------------------------------------- runs


def baselines(state: dict[str, torch.Tensor], device: torch.device, repeats: int) -> list[Timing]:
    nbytes = sum(t.nbytes for t in state.values())
    tensors = list(state.values())
    out = [timed("D2H .cpu() (fresh pageable)", nbytes, lambda: [t.cpu() for t in tensors], device, repeats,
                 note="what tensors.flatten does; a no-op on --device cpu")]  # fmt: skip
    pageable = [t.to("cpu", copy=True) for t in tensors]
    targets = [torch.empty_like(t) for t in tensors]
    if device.type == "cuda":
        pinned = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in tensors]

        def d2h_pinned() -> None:
            for p, t in zip(pinned, tensors, strict=True):
                p.copy_(t, non_blocking=True)

        def h2d_pinned() -> None:
            for d, p in zip(targets, pinned, strict=True):
                d.copy_(p, non_blocking=True)

        out.append(timed("D2H copy_ into pinned", nbytes, d2h_pinned, device, repeats, note="hardware floor"))
        out.append(timed("H2D copy_ from pinned", nbytes, h2d_pinned, device, repeats, note="hardware floor"))

    def h2d_pageable() -> None:
        for d, p in zip(targets, pageable, strict=True):
            d.copy_(p)

    out.append(timed("H2D copy_ from pageable", nbytes, h2d_pageable, device, repeats,
                     note="what load_weights does with pulled tensors"))  # fmt: skip
    flat_src = np.ones(nbytes, dtype=np.uint8)
    flat_dst = np.zeros(nbytes, dtype=np.uint8)
    out.append(timed("host memcpy np.copyto (pre-touched)", nbytes, lambda: np.copyto(flat_dst, flat_src),
                     device, repeats))  # fmt: skip
    out.append(timed("xxh3-128 of the bytes", nbytes, lambda: layout.digest(flat_src), device, repeats,
                     note="Treadle hashes once in publish, once in pull"))  # fmt: skip
    return out


def file_baselines(root: Path, nbytes: int, bucket: int, device: torch.device, repeats: int) -> list[Timing]:
    """Plain write and read of the same bytes as files of ``bucket`` bytes (the store's floor)."""
    src = np.ones(min(nbytes, bucket), dtype=np.uint8)
    dst = np.zeros(min(nbytes, bucket), dtype=np.uint8)
    sizes = [min(bucket, nbytes - at) for at in range(0, nbytes, bucket)]
    files = [root / f"plain{i:03d}" for i in range(len(sizes))]

    def write() -> None:
        for path, size in zip(files, sizes, strict=True):
            with open(path, "wb") as f:
                f.write(src[:size].data)

    def read() -> None:
        for path, size in zip(files, sizes, strict=True):
            with open(path, "rb") as f:
                f.readinto(dst[:size].data)

    def remove() -> None:
        for path in files:
            path.unlink(missing_ok=True)

    out = [timed("file write (fresh files)", nbytes, write, device, repeats, setup=remove)]
    out.append(timed("file read into reused buffer", nbytes, read, device, repeats, note="page cache"))
    remove()
    return out


BUFFERS: dict[str, pull.Allocate] = {"pageable": pull.pageable, "pinned": pull.pinned}


def buffer_kinds(cfg: Config) -> list[str]:
    choice = {"both": ["pageable", "pinned"], "off": ["pageable"], "on": ["pinned"]}.get(cfg.pinned)
    if choice is None:
        raise SystemExit(f"--pinned {cfg.pinned!r}: use both, on or off")
    return choice


def swap_stages(
    state: dict[str, torch.Tensor],
    model: TorchStandIn,
    root: Path,
    cfg: Config,
    device: torch.device,
) -> tuple[list[Timing], dict[str, Any]]:
    """publish -> Loader.prefetch -> Loader.apply per pull buffer kind; one warm-up then ``cfg.repeats``."""
    nbytes = sum(t.nbytes for t in state.values())
    store = objects.FileStore(root)
    publisher = publish.Publisher(store, PREFIX, bucket_bytes=cfg.bucket_mib << 20, staleness_window=0)
    spec = {name: ("bfloat16", tuple(t.shape)) for name, t in state.items()}
    kinds = buffer_kinds(cfg)

    def fatal(exc: BaseException) -> NoReturn:
        raise RuntimeError("load failed after the model was modified") from exc

    loaders = {
        kind: loader.Loader(
            pull.Reader(store, PREFIX, deadline_s=300, allocate=BUFFERS[kind]),
            spec,
            kind="torch",
            on_fatal=fatal,
        )
        for kind in kinds
    }
    applied: set[str] = set()
    pinned_seen: dict[str, bool] = {}

    def loading(kind: str) -> Callable[[Iterable[tuple[str, Any]]], None]:
        def load(weights: Iterable[tuple[str, Any]]) -> None:
            pairs = list(weights)
            # What the driver will see: is the memory load_weights copies from page-locked?
            pinned_seen[kind] = bool(pairs[0][1].is_pinned()) if device.type == "cuda" else False
            applied.update(model.load_weights(pairs))
            sync(device)

        return load

    samples: dict[str, list[float]] = {"publish": []}
    for kind in kinds:
        samples[f"prefetch {kind}"] = []
        samples[f"apply {kind}"] = []
    first: dict[str, float] = {}
    info: dict[str, Any] = {}
    try:
        for version in range(1, 2 + cfg.repeats):
            sync(device)
            t0 = time.perf_counter()
            manifest = publisher.publish(state, version)
            t1 = time.perf_counter()
            if version > 1:
                samples["publish"].append(t1 - t0)
            for kind in kinds if version % 2 == 0 else kinds[::-1]:
                weights_loader = loaders[kind]
                t1 = time.perf_counter()
                weights_loader.prefetch(version)
                while version not in weights_loader.status()["prefetched"]:
                    if weights_loader.status()["prefetching"] == []:  # failed: apply raises its error
                        break
                    time.sleep(0.001)
                t2 = time.perf_counter()
                weights_loader.apply(version, loading(kind))
                t3 = time.perf_counter()
                if version > 1:
                    samples[f"prefetch {kind}"].append(t2 - t1)
                    samples[f"apply {kind}"].append(t3 - t2)
                else:
                    first[kind] = t2 - t1
            info = {"buckets": len(manifest.buckets), "stored_bytes": manifest.total_bytes}
        for weights_loader in loaders.values():
            assert weights_loader.loaded_version == 1 + cfg.repeats
        assert len(applied) == len(model.params), "the stand-in did not receive every parameter"
        # The last version really landed: spot-check one tensor and one stacked shard on the device.
        name = "model.layers.0.self_attn.k_proj.weight"
        row, rows = model.shards[("model.layers.0.self_attn.qkv_proj.weight", 1)]
        assert torch.equal(
            model.params["model.layers.0.self_attn.qkv_proj.weight"][row : row + rows], state[name]
        )
        assert torch.equal(model.params["lm_head.weight"], state["lm_head.weight"])
    finally:
        for weights_loader in loaders.values():
            weights_loader.close()
        publisher.close()
    notes = {
        "publish": "Publisher.publish from device tensors: D2H + pack + xxh3 + write + commit",
        "prefetch": "Loader.prefetch until done: Reader.pull, read + xxh3 check, reused {} buffer",
        "apply": "Loader.apply: spec check + stand-in load_weights (H2D copy_ from {} memory) + sync",
    }
    stages = [Timing("publish", nbytes, samples["publish"], notes["publish"])]
    for kind in kinds:
        seen = f"; is_pinned() {pinned_seen.get(kind)}"
        stages.append(
            Timing(f"prefetch {kind}", nbytes, samples[f"prefetch {kind}"], notes["prefetch"].format(kind))
        )
        stages.append(
            Timing(f"apply {kind}", nbytes, samples[f"apply {kind}"], notes["apply"].format(kind) + seen)
        )
    for kind in kinds:
        total = zip(samples["publish"], samples[f"prefetch {kind}"], samples[f"apply {kind}"], strict=True)
        stages.append(Timing(f"publish+prefetch+apply {kind}", nbytes, [sum(x) for x in total]))
    for kind in kinds:
        stages.append(Timing(f"first prefetch {kind}", nbytes, [first[kind]],
                             note="warm-up version: allocates the buffer (one sample)"))  # fmt: skip
    info["is_pinned"] = pinned_seen
    return stages, info


def print_table(title: str, rows: list[Timing]) -> None:
    print(f"\n{title}")
    print(f"  {'what':<38} {'GB':>7} {'median s':>9} {'min s':>8} {'GB/s':>7}  note")
    for r in rows:
        print(
            f"  {r.what:<38} {r.nbytes / GB:>7.3f} {r.median:>9.4f} {r.best:>8.4f} {r.gbps:>7.2f}  {r.note}"
        )


def ratios(stages: list[Timing], base: dict[str, Timing]) -> list[tuple[str, str, float]]:
    """(stage, floor or other stage, median / median) for what was measured on this device."""
    by = {s.what: s for s in stages} | base
    pairs = [
        ("publish", "D2H copy_ into pinned"), ("publish", "D2H .cpu() (fresh pageable)"),
    ]  # fmt: skip
    for kind in BUFFERS:
        pairs += [
            (f"prefetch {kind}", "file read into reused buffer"),
            (f"prefetch {kind}", "host memcpy np.copyto (pre-touched)"),
            (f"apply {kind}", "H2D copy_ from pinned"), (f"apply {kind}", "H2D copy_ from pageable"),
            (f"publish+prefetch+apply {kind}", "D2H copy_ into pinned"),
        ]  # fmt: skip
    pairs += [("apply pageable", "apply pinned"), ("prefetch pageable", "prefetch pinned"),
              ("publish+prefetch+apply pageable", "publish+prefetch+apply pinned")]  # fmt: skip
    return [(a, b, by[a].median / by[b].median) for a, b in pairs if a in by and b in by]


def run_size(cfg: Config, params: float, device: torch.device) -> dict[str, Any]:
    shape = llama_shape(params)
    state = random_state(shape, device, cfg.seed)
    nbytes = sum(t.nbytes for t in state.values())
    print(f"\n=== {shape.count() / 1e9:.3f}e9 parameters, bf16, {nbytes / GB:.3f} GB, {len(state)} tensors: "
          f"{dataclasses.asdict(shape)}")  # fmt: skip
    model = TorchStandIn(shape, device)
    base = baselines(state, device, cfg.repeats)
    print_table("baselines (same bytes, same run)", base)
    result: dict[str, Any] = {"params": shape.count(), "bytes": nbytes, "shape": dataclasses.asdict(shape),
                              "baselines": [b.row() for b in base], "stores": {}}  # fmt: skip
    for kind in [k.strip() for k in cfg.stores.split(",") if k.strip()]:
        with store_root(kind, cfg) as root:
            where = fs_info(root)
            need = 2 * nbytes + (cfg.bucket_mib << 20) + (1 << 28)
            if shutil.disk_usage(root).free < need:
                print(f"\nstore {kind} ({root}: {where}): skipped, needs {need / GB:.1f} GB free")
                result["stores"][kind] = {"root": str(root), "fs": where, "skipped": True}
                continue
            files = file_baselines(root, nbytes, cfg.bucket_mib << 20, device, cfg.repeats)
            stages, info = swap_stages(state, model, root, cfg, device)
            print_table(
                f"store {kind}: FileStore at {root} ({where}); {info['buckets']} bucket(s)", files + stages
            )
            floors = {b.what: b for b in base + files}
            print(f"  load_weights got pinned tensors (torch is_pinned of the first): {info['is_pinned']}")
            if device.type == "cuda":
                with contextlib.suppress(Exception):  # host_memory_stats is recent torch
                    reserved = torch.cuda.host_memory_stats().get("reserved_bytes.current")
                    info["pinned_host_reserved_bytes"] = reserved
                    print(f"  torch pinned host memory reserved (alive or cached): {reserved} bytes")
            print("  ratios, median / median:")
            for stage, floor, ratio in ratios(stages, floors):
                print(f"    {stage:<31} / {floor:<36} = {ratio:6.2f}x")
            result["stores"][kind] = {"root": str(root), "fs": where, **info,
                                      "files": [f.row() for f in files], "stages": [s.row() for s in stages],
                                      "ratios": ratios(stages, floors)}  # fmt: skip
    del state, model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return result


def main() -> None:
    cfg = benchcli.parse(Config, __doc__)
    device = torch.device(cfg.device)
    if device.type == "cuda":
        gpu = torch.cuda.get_device_name(device)
        props = torch.cuda.get_device_properties(device)
        print(f"GPU: {gpu}, {props.total_memory / GB:.1f} GB; CUDA {torch.version.cuda}")
    else:
        gpu = "none (--device cpu: a smoke test, the device-host copies are host copies or no-ops)"
        print(f"GPU: {gpu}")
    print(f"torch {torch.__version__}, numpy {np.__version__}, python {platform.python_version()}, "
          f"{os.cpu_count()} CPUs, {platform.machine()}")  # fmt: skip
    print("apply target: a TORCH STAND-IN (parameters on the device, load_weights = param.data.copy_ per "
          "tensor, vLLM-style qkv/gate_up stacking), NOT a vLLM engine")  # fmt: skip
    print(f"bucket {cfg.bucket_mib} MiB, staleness window 0, one warm-up + {cfg.repeats} timed versions, "
          f"GB = 1e9 bytes")  # fmt: skip
    pinned_note = (
        "page-locked" if device.type == "cuda" and torch.cuda.is_available() else "PAGEABLE (no CUDA)"
    )
    print(f"pull buffers: {', '.join(buffer_kinds(cfg))}; pull.pinned gives {pinned_note} memory here")
    results = {"gpu": gpu, "torch": torch.__version__, "config": dataclasses.asdict(cfg),
               "sizes": [run_size(cfg, p, device) for p in cfg.params]}  # fmt: skip
    if cfg.json_out:
        Path(cfg.json_out).write_text(json.dumps(results, indent=2, default=str))
        print(f"\nwritten to {cfg.json_out}")


if __name__ == "__main__":
    main()
