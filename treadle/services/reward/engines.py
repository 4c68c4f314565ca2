"""The engines that serve the reward gateway's reward models (``gpus.GpuManager`` restores, evicts
and asks them for a client), chosen by the models' ``engine``:

- ``SimulatedEngines``: "GPU memory" is host memory: a restore really copies the shard's bytes out
  of the backup (timed: the restore time is measured, on this machine's memory bandwidth, not a
  GPU's), and each resident variant is served by a SIMULATED vLLM engine process (``python -m
  treadle.services.fakevllm``), started on the variant's first restore on a chunk and kept, whose
  generation is simulated (its step time shrinks with the degree as ``SIMULATED_STEP_S / k**0.8``).
- ``VllmEngines``: real vLLM, one engine process per variant and chunk (tensor parallel over the
  chunk's GPUs), started on the variant's first grant there. The backup is a copy of the model's
  safetensors in host memory (a tmpfs, ``/dev/shm`` in the pod); a restore reloads the engine's
  weights from it in place (the worker extension's ``treadle_weights_restore``) and is timed. On
  CUDA an eviction puts the engine to sleep at level 2 (weights and KV cache freed) and a restore
  wakes it first; vLLM's CPU worker has no sleep mode, so there an evicted engine keeps its memory
  and only the reload is measured (docs/TANGRAM.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import shutil
import signal
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol

import httpx
import numpy as np

from treadle import errors
from treadle.api import base, v1alpha1
from treadle.policy.tangram import buddy
from treadle.weights import loader, store

FOOTPRINT = 1.2
"""GPU memory of a variant per GPU: its weight shard times this (KV cache and activations: our choice)."""
SIMULATED_STEP_S = 0.004
"""The simulated engine's decode step on one GPU; a degree-k variant steps in this / k**0.8."""
FIELD = "spec.externalResources.rewardModels"
BACKUP_DIR = Path("/dev/shm/treadle-reward-models")
"""Where ``VllmEngines`` copy the checkpoints: host memory (the pod's ``/dev/shm`` is a memory emptyDir)."""


def variant(name: str, degree: int) -> str:
    return f"{name}@tp{degree}"


class Engines(Protocol):
    async def restore(self, rm: v1alpha1.RewardModel, degree: int, chunk: buddy.Chunk) -> float:
        """Make ``rm`` at ``degree`` resident on ``chunk``; the seconds its weights took to restore."""
        ...

    def evict(self, name: str, degree: int, chunk: buddy.Chunk) -> None: ...

    def client(self, name: str, degree: int, chunk: buddy.Chunk) -> httpx.AsyncClient:
        """An OpenAI-compatible client of the resident variant."""
        ...

    def served_name(self, name: str) -> str | None:
        """The ``model`` a request to ``name``'s engine names (None: the engine's only model)."""
        ...

    async def aclose(self) -> None: ...


def engines(
    models: Sequence[v1alpha1.RewardModel], *, backup_dir: Path, gpu_gb: float
) -> SimulatedEngines | VllmEngines | None:
    """The engines of ``models`` (their one ``engine``, a rule of the spec); None without models."""
    if not models:
        return None
    if models[0].engine == "vllm":
        return VllmEngines(models, backup_dir=backup_dir, gpu_gb=gpu_gb, cuda=cuda_available())
    return SimulatedEngines(models)


class SimulatedEngines:
    """Host-memory backups, real shard copies, simulated engine processes (module doc)."""

    def __init__(self, models: Sequence[v1alpha1.RewardModel], *, start_timeout_s: float = 60.0) -> None:
        # Filled, not zeroed: untouched zero pages would cost no copy and the restore time would lie.
        self.backups = {m.name: np.full(int(m.weights_gb * 1e9), 0x5A, dtype=np.uint8) for m in models}
        self.start_timeout_s = start_timeout_s
        self._resident: dict[tuple[str, int, buddy.Chunk], list[np.ndarray]] = {}
        self._procs: dict[
            tuple[str, int, buddy.Chunk], tuple[asyncio.subprocess.Process, httpx.AsyncClient]
        ] = {}

    async def restore(self, rm: v1alpha1.RewardModel, degree: int, chunk: buddy.Chunk) -> float:
        key = (rm.name, degree, chunk)
        if key not in self._procs:  # the engine's one-off start is not part of a restore
            self._procs[key] = await self._start(degree)
        backup = self.backups[rm.name]
        shard = len(backup) // degree
        started = time.perf_counter()
        # One copy per GPU of the chunk, from that GPU's shard of the backup, as each link would move it.
        self._resident[key] = [
            np.array(backup[i * shard : (i + 1) * shard], copy=True) for i in range(degree)
        ]
        return time.perf_counter() - started

    def evict(self, name: str, degree: int, chunk: buddy.Chunk) -> None:
        self._resident.pop((name, degree, chunk), None)

    def client(self, name: str, degree: int, chunk: buddy.Chunk) -> httpx.AsyncClient:
        if (name, degree, chunk) not in self._resident:
            raise errors.Unavailable(f"{variant(name, degree)} is not resident on {chunk}")
        return self._procs[(name, degree, chunk)][1]

    def served_name(self, name: str) -> str | None:
        return None  # fakevllm serves one model, under its own name

    async def _start(self, degree: int) -> tuple[asyncio.subprocess.Process, httpx.AsyncClient]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        step_ms = 1000 * SIMULATED_STEP_S / degree**0.8
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "treadle.services.fakevllm", "--host", "127.0.0.1", "--port", str(port),
            "--step-ms", f"{step_ms:.4f}", "--eos-probability", "0.1",
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        client = httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60)
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if proc.returncode is not None:
                break
            with contextlib.suppress(httpx.HTTPError):
                if (await client.get("/health")).status_code == 200:
                    return proc, client
            await asyncio.sleep(0.1)
        proc.kill()
        await client.aclose()
        raise errors.Unavailable(
            f"the simulated reward-model engine did not start in {self.start_timeout_s}s"
        )

    async def aclose(self) -> None:
        for proc, client in self._procs.values():
            proc.terminate()
            await client.aclose()
        for proc, _ in self._procs.values():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.wait(), 5)
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        self._procs.clear()


VLLM_EXTENSION = base.VLLM_WORKER_EXTENSION


@dataclasses.dataclass(eq=False)
class _Engine:
    started: asyncio.Task[httpx.AsyncClient]
    process: asyncio.subprocess.Process | None = None
    sleeping: asyncio.Task[None] | None = None
    """CUDA: the ``/sleep`` of its last eviction; a restore wakes it once that has answered."""


class VllmEngines:
    """Real vLLM engines per variant and chunk; restores reload weights from host memory (module doc)."""

    def __init__(
        self, models: Sequence[v1alpha1.RewardModel], *, backup_dir: Path, gpu_gb: float, cuda: bool,
        start_timeout_s: float = 900.0, environ: Mapping[str, str] = os.environ,
    ) -> None:  # fmt: skip
        self.backup_dir = backup_dir
        self.gpu_gb, self.cuda, self.start_timeout_s, self.environ = gpu_gb, cuda, start_timeout_s, environ
        self.backups: dict[str, Path] = {}
        """Model name -> its copy in host memory, made once its first engine has started (vLLM has
        then fetched a hub model into the local cache, where ``loader.model_dir`` finds it)."""
        self._backing_up = asyncio.Lock()
        self._engines: dict[tuple[str, int, buddy.Chunk], _Engine] = {}
        self._resident: set[tuple[str, int, buddy.Chunk]] = set()
        self._closing: set[asyncio.Future[None]] = set()
        """Clients of engines that exited, closing."""

    async def restore(self, rm: v1alpha1.RewardModel, degree: int, chunk: buddy.Chunk) -> float:
        """The reload's seconds; ``Unavailable`` while the engine is still starting (its first grant)."""
        key = (rm.name, degree, chunk)
        engine = self._engines.get(key)
        if engine is None:
            engine = self._engines[key] = _Engine(asyncio.create_task(self._start(rm, degree, chunk, key)))
        if not engine.started.done():
            raise errors.Unavailable(f"the vLLM engine of {variant(rm.name, degree)} on {chunk} is starting")
        if (failed := engine.started.exception()) is not None:
            del self._engines[key]  # the next grant here starts it again
            raise failed
        self._check_alive(key)
        client = engine.started.result()
        began = time.perf_counter()
        if engine.sleeping is not None:
            sleeping, engine.sleeping = engine.sleeping, None
            with contextlib.suppress(errors.Unavailable):  # a sleep that failed left it awake
                await sleeping
            await _post(client, "/wake_up")
        await _post(client, "/collective_rpc",
                    {"method": "treadle_weights_restore", "args": [str(self.backups[rm.name])]})  # fmt: skip
        await _post(client, "/reset_prefix_cache")
        self._resident.add(key)
        return time.perf_counter() - began

    def evict(self, name: str, degree: int, chunk: buddy.Chunk) -> None:
        key = (name, degree, chunk)
        self._resident.discard(key)
        engine = self._engines.get(key)
        if self.cuda and engine is not None and engine.started.done() and not engine.started.exception():
            engine.sleeping = asyncio.create_task(_post(engine.started.result(), "/sleep?level=2"))

    def client(self, name: str, degree: int, chunk: buddy.Chunk) -> httpx.AsyncClient:
        key = (name, degree, chunk)
        if key not in self._resident:
            raise errors.Unavailable(f"{variant(name, degree)} is not resident on {chunk}")
        self._check_alive(key)
        return self._engines[key].started.result()

    def _check_alive(self, key: tuple[str, int, buddy.Chunk]) -> None:
        """``Unavailable`` if the engine exited (killed, crashed); it is started again on the next grant."""
        engine = self._engines[key]
        if engine.process is None or engine.process.returncode is None:
            return
        del self._engines[key]
        self._resident.discard(key)
        _stop_group(engine.process, signal.SIGKILL)  # what is left of it: its engine core, its workers
        self._closing.add(asyncio.ensure_future(engine.started.result().aclose()))
        name, degree, chunk = key
        raise errors.Unavailable(
            f"the vLLM engine of {variant(name, degree)} on {chunk} exited with {engine.process.returncode}; "
            "the next grant there starts it again"
        )

    def served_name(self, name: str) -> str | None:
        return name  # vllm_argv's --served-model-name

    async def _start(
        self, rm: v1alpha1.RewardModel, degree: int, chunk: buddy.Chunk, key: tuple[str, int, buddy.Chunk]
    ) -> httpx.AsyncClient:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env = {**self.environ, **{e.name: e.value for e in rm.engine_env}, "VLLM_SERVER_DEV_MODE": "1"}
        if self.cuda:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in range(chunk.start, chunk.end))
        proc = await asyncio.create_subprocess_exec(
            *vllm_argv(rm, degree, port=port, cuda=self.cuda, gpu_gb=self.gpu_gb), env=env,
            # vLLM's engine core and workers are its children: stopped as a group; and stopped when the
            # gateway dies without stopping them (SIGKILL, OOM), as a container's processes are
            start_new_session=True, preexec_fn=store.die_with_parent,
        )  # fmt: skip
        self._engines[key].process = proc
        client = httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=120)
        try:
            deadline = time.monotonic() + self.start_timeout_s
            while time.monotonic() < deadline and proc.returncode is None:
                with contextlib.suppress(httpx.HTTPError):
                    if (await client.get("/health")).status_code == 200:
                        async with self._backing_up:
                            if rm.name not in self.backups:
                                to = self.backup_dir / rm.name
                                self.backups[rm.name] = await asyncio.to_thread(backup, rm, to)
                        return client
                await asyncio.sleep(1.0)
            ended = "exited" if proc.returncode is not None else f"did not start in {self.start_timeout_s}s"
            raise errors.Unavailable(f"the vLLM engine of {variant(rm.name, degree)} on {chunk} {ended}")
        except BaseException:
            await client.aclose()
            _stop_group(proc, signal.SIGKILL)
            raise

    async def aclose(self) -> None:
        for engine in self._engines.values():
            engine.started.cancel()
            if engine.sleeping is not None:
                engine.sleeping.cancel()
            if engine.process is not None and engine.process.returncode is None:
                _stop_group(engine.process, signal.SIGTERM)
        for engine in self._engines.values():
            if engine.process is not None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(engine.process.wait(), 30)
                if engine.process.returncode is None:
                    _stop_group(engine.process, signal.SIGKILL)
                    await engine.process.wait()
            with contextlib.suppress(BaseException):
                await (await engine.started).aclose()
        self._engines.clear()
        await asyncio.gather(*self._closing, return_exceptions=True)


def backup(rm: v1alpha1.RewardModel, to: Path) -> Path:
    """Copy ``rm``'s safetensors into ``to`` (host memory when ``to`` is on a tmpfs); returns ``to``."""
    source = loader.model_dir(rm.model)
    files = sorted(source.glob("*.safetensors"))
    if not files:
        raise errors.SpecError(f"{source} holds no *.safetensors to back up", field=f"{FIELD}.model",
                               value=rm.model)  # fmt: skip
    to.mkdir(parents=True, exist_ok=True)
    for f in files:
        shutil.copyfile(f, to / f.name)
    return to


def vllm_argv(rm: v1alpha1.RewardModel, degree: int, *, port: int, cuda: bool, gpu_gb: float) -> list[str]:
    """The engine of ``rm`` at ``degree``: on CUDA with sleep mode and the GPU share the manager gives
    it (its footprint over one GPU's memory); on CPU in float32, the recipe of ``models.vllm_server``."""
    device = (
        [
            "--enable-sleep-mode",
            "--gpu-memory-utilization",
            f"{rm.weights_gb / degree * FOOTPRINT / gpu_gb:.3f}",
        ]
        if cuda
        else ["--dtype", "float32"]
    )
    return [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        rm.model,
        "--served-model-name",
        rm.name,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--tensor-parallel-size",
        str(degree),
        "--worker-extension-cls",
        VLLM_EXTENSION,
        *device,
        *rm.engine_args,
    ]


def cuda_available() -> bool:
    """Whether this process's torch sees a GPU (the vLLM image's; no torch: False)."""
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())  # fmt: skip


async def _post(client: httpx.AsyncClient, path: str, body: object = None) -> None:
    try:
        response = await client.post(path, json=body)
    except httpx.HTTPError as exc:
        raise errors.Unavailable(f"reward-model engine {path}: {type(exc).__name__}: {exc}") from exc
    if response.status_code != 200:
        raise errors.Unavailable(
            f"reward-model engine {path}: HTTP {response.status_code} {response.text[:200]}"
        )


def _stop_group(proc: asyncio.subprocess.Process, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)
