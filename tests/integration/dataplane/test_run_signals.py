"""``treadle run`` stopped by SIGTERM or SIGINT mid-run stops every service process it started.

The services run in sessions of their own, so no signal to ``treadle run``'s group reaches them;
before ``cli.until_signalled`` a SIGTERM left all of them running. A real ``treadle run`` process
(SIMULATED engines), its children listed while it runs, then the signal.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[3]
JOB = ROOT / "manifests" / "examples" / "math-tool-h20.yaml"


def _wait_for_line(proc: subprocess.Popen[str], needle: str, *, timeout_s: float) -> list[str]:
    assert proc.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + timeout_s
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if not sel.select(timeout=0.5):
                continue
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if needle in line:
                return lines
    raise AssertionError(f"no {needle!r} from treadle run in {timeout_s}s:\n{''.join(lines)}")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_stops_every_service_process(tmp_path: Path, sig: signal.Signals) -> None:
    argv = [
        sys.executable, "-m", "treadle.cli", "run", str(JOB), "--trajectories", "2048",
        "--workers-per-pool", "1", "--env-servers", "1", "--engine-step-ms", "5", "--interval", "0.5",
        "--run-dir", str(tmp_path / "run"),
    ]  # fmt: skip
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    try:
        _wait_for_line(proc, " done ", timeout_s=120)  # a progress line: services up, trajectories running
        children = psutil.Process(proc.pid).children(recursive=True)
        assert len(children) >= 5, [c.cmdline() for c in children]  # engine, agent, env, reward, buffer, ...
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 128 + sig.value, out[-3000:]
        assert f"stopped by {sig.name}" in out
        _, alive = psutil.wait_procs(children, timeout=10)
        assert not alive, [c.cmdline() for c in alive]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
