"""Reward models on REAL vLLM (CPU build) in the reward gateway (``engine: vllm``, ARL-Tangram §5.3).

The gateway runs as its own process from a job file, as its pod does; it starts one vLLM engine per
variant and chunk itself. The job declares one reward-model GPU that holds one variant at a time, and
two reward models (two tiny random Llamas of different seeds), so alternating them evicts and
restores. A restore reloads the engine's weights from the gateway's copy of the checkpoint in host
memory; the test proves the copy is what gets loaded by zeroing the copy of one model between two of
its restores (its verdict changes) and putting it back (its first verdict returns, token for token).
Then one engine is SIGKILLed while its model is resident: the gateway starts it again on the next
grading. Then the gateway is SIGKILLed: its engines go with it.
vLLM's CPU worker has no sleep mode, so eviction frees no memory here (docs/TANGRAM.md).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from safetensors import numpy as st_numpy

from treadle import metrics
from treadle.api import v1alpha1
from treadle.models import vllm_server
from treadle.services import podenv
from treadle.testing import procs, scraped

CONTEXT = 2048
START_S = 600.0


@pytest.fixture(scope="module")
def judges(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    pytest.importorskip("vllm")
    from treadle.models import tiny

    root = tmp_path_factory.mktemp("judges")
    return {
        name: tiny.generate(root / name, seed=seed, context=CONTEXT)
        for seed, name in enumerate(("alpha", "beta"))
    }


def job(judges: dict[str, Path]) -> v1alpha1.RolloutJob:
    models = [
        {"name": name, "model": str(path), "weightsGb": 0.05, "engine": "vllm",
         "engineArgs": ["--max-model-len", str(CONTEXT), "--max-num-seqs", "2", "--enforce-eager"]}
        for name, path in judges.items()
    ]  # fmt: skip
    return v1alpha1.parse_job({
        "apiVersion": v1alpha1.API_VERSION, "kind": v1alpha1.KIND, "metadata": {"name": "judged"},
        "spec": {
            "agents": [{"name": "a", "model": "m"}],
            "pools": [{"name": "p", "agent": "a", "accelerator": "H20"}],
            "tasks": [{"name": n, "agents": ["a"], "environment": "math-tool", "reward": f"judge:{n}"}
                      for n in judges],
            "externalResources": {"rewardModelGpus": 1, "rewardModelGpuMemoryGb": 0.07,
                                  "rewardModels": models},
        },
    })  # fmt: skip


@contextlib.contextmanager
def gateway(tmp: Path, judges: dict[str, Path]) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    port = procs.free_port()
    url = f"http://127.0.0.1:{port}"
    env = vllm_server.environment(tmp / "vllm-cache") | podenv.job_env(job(judges), tmp)
    argv = [sys.executable, "-m", "treadle.services.reward", "--host", "127.0.0.1", "--port", str(port),
            "--backup-dir", str(tmp / "backups")]  # fmt: skip
    with procs.running("reward", argv, lambda: healthy(url), env=env, timeout=60) as proc:
        yield url, proc


def healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


class Scorer:
    def __init__(self, url: str) -> None:
        self.http = httpx.Client(base_url=url, timeout=120)
        self.ids = iter(range(1_000_000))

    def score(self, name: str) -> dict[str, Any]:
        """One grading by ``name``, waiting out its engine's first start (the gateway answers 503)."""
        body = {"trajectory_id": f"t{next(self.ids)}", "reward_fn": f"judge:{name}", "prompt": "6 x 7?",
                "reference": "42", "response": "The answer is 42."}  # fmt: skip
        deadline = time.monotonic() + START_S
        while True:
            r = self.http.post("/v1/score", json=body)
            if r.status_code != 503 or time.monotonic() > deadline:
                break
            time.sleep(2.0)
        assert r.status_code == 200, r.text
        result: dict[str, Any] = r.json()
        return result


def verdict(result: dict[str, Any]) -> str:
    return str(result["details"]["verdict"])


def restore_s(result: dict[str, Any]) -> float:
    return float(result["details"]["restore_s"])


def zero_copy(backup: Path) -> dict[Path, bytes]:
    """Zero every tensor of the host-memory copy in ``backup``; returns the files as they were."""
    kept = {}
    for f in sorted(backup.glob("*.safetensors")):
        kept[f] = f.read_bytes()
        st_numpy.save_file({k: v * 0 for k, v in st_numpy.load_file(str(f)).items()}, str(f))
    return kept


def descendants(pid: int) -> dict[int, str]:
    """Every process below ``pid``, with its command line (from /proc)."""
    children: dict[int, list[int]] = {}
    for status in Path("/proc").glob("[0-9]*/status"):
        with contextlib.suppress(OSError):
            ppid = int(next(x for x in status.read_text().splitlines() if x.startswith("PPid:")).split()[1])
            children.setdefault(ppid, []).append(int(status.parent.name))
    found, todo = {}, list(children.get(pid, []))
    while todo:
        p = todo.pop()
        with contextlib.suppress(OSError):
            found[p] = Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        todo += children.get(p, [])
    return found


def running(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie (an orphan whose reaper, e.g. a subreaper that a
    sandbox test made of this pytest process, has not collected it yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def test_vllm_reward_models_restore_from_host_memory_on_one_gpu(
    tmp_path: Path, judges: dict[str, Path]
) -> None:
    with gateway(tmp_path, judges) as (url, proc):
        s = Scorer(url)
        alpha = s.score("alpha")  # alpha's engine starts, then its first restore
        beta = s.score("beta")  # one GPU: alpha is evicted, beta's engine starts and restores
        again = s.score("alpha")
        assert restore_s(alpha) > 0 and restore_s(beta) > 0 and restore_s(again) > 0
        repeat = s.score("alpha")
        assert restore_s(repeat) == 0.0  # still resident: cache affinity, no restore
        assert verdict(again) == verdict(repeat) == verdict(alpha)  # temperature 0: the same weights

        kept = zero_copy(tmp_path / "backups" / "alpha")
        s.score("beta")  # evicts alpha
        zeroed = s.score("alpha")  # restored from the zeroed copy
        assert restore_s(zeroed) > 0 and verdict(zeroed) != verdict(alpha), verdict(zeroed)
        for f, data in kept.items():
            f.write_bytes(data)
        s.score("beta")
        back = s.score("alpha")
        assert restore_s(back) > 0 and verdict(back) == verdict(alpha)

        # alpha's engine killed while resident: its next gradings answer 503 until it is started again
        (engine,) = [
            p for p, cmd in descendants(proc.pid).items() if "api_server" in cmd and " alpha " in cmd
        ]
        os.kill(engine, signal.SIGKILL)
        revived = s.score("alpha")
        assert restore_s(revived) > 0 and verdict(revived) == verdict(alpha)

        text = s.http.get("/metrics").text
        # Killed without a chance to stop them, the gateway leaves no engine behind (PR_SET_PDEATHSIG).
        engines = descendants(proc.pid)
        assert sum("api_server" in cmdline for cmdline in engines.values()) == 2, engines
        proc.kill()
        deadline = time.monotonic() + 60
        while (alive := [p for p in engines if running(p)]) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not alive, {p: engines[p] for p in alive}
    restores = scraped.by_label(scraped.parse(text), metrics.REWARD_MODEL_RESTORES_TOTAL, "model")
    evictions = scraped.by_label(scraped.parse(text), metrics.REWARD_MODEL_EVICTIONS_TOTAL, "model")
    assert restores == {"alpha": 5.0, "beta": 3.0}, restores
    assert evictions == {"alpha": 3.0, "beta": 3.0}, evictions
    timed = sorted(restore_s(r) for r in (alpha, beta, again, zeroed, back, revived))
    print(f"vLLM reward-model restores from host memory: {[round(t, 4) for t in timed]} s; verdicts "
          f"alpha {verdict(alpha)!r} beta {verdict(beta)!r} zeroed {verdict(zeroed)!r}")  # fmt: skip
