"""``treadle run`` and ``treadle train`` stopped mid-run, however, leave no service process behind.

The services run in sessions of their own, so no signal to the run's group reaches them; before
``cli.until_signalled`` a SIGTERM to ``treadle run`` left all of them running, and a SIGKILL of
either command (or a SIGTERM of ``treadle train``) orphaned every child. Now ``treadle run`` stops
them in order on SIGTERM and SIGINT, and every service is SIGKILLed by the kernel when the process
that started it dies (``localmode.stack``). A real process (SIMULATED engines), its children listed
while it runs, then the signal.
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
    raise AssertionError(f"no {needle!r} from {proc.args[3]} in {timeout_s}s:\n{''.join(lines)}")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL], ids=lambda s: s.name)
def test_a_signal_stops_every_service_process(tmp_path: Path, sig: signal.Signals) -> None:
    argv = [
        sys.executable, "-m", "treadle.cli", "run", str(JOB), "--trajectories", "2048",
        "--workers-per-pool", "1", "--env-servers", "1", "--engine-step-ms", "5", "--interval", "0.5",
        "--run-dir", str(tmp_path / "run"),
    ]  # fmt: skip
    out = _signalled(argv, " done ", sig)  # a progress line: services up, trajectories running
    if sig != signal.SIGKILL:  # a SIGKILL leaves nothing to say
        assert f"stopped by {sig.name}" in out


@pytest.mark.timeout(600)  # the trainer's model and seven services start first: minutes at load
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=lambda s: s.name)
def test_treadle_train_killed_leaves_no_service_behind(tmp_path: Path, sig: signal.Signals) -> None:
    argv = [
        sys.executable, "-m", "treadle.cli", "train", "--engine", "simulated", "--steps", "1000",
        "--run-dir", str(tmp_path / "run"),
    ]  # fmt: skip
    _signalled(argv, "processes healthy", sig)


@pytest.mark.timeout(600)
def test_treadle_train_names_a_service_that_died_and_exits_non_zero(tmp_path: Path) -> None:
    """The buffer SIGKILLed once training starts: ``treadle train`` stops within seconds, exits 1 and
    names it, its exit status and its log, and leaves no other service running (before, the trainer
    waited out its batch timeout, printing nothing)."""
    proc = _start([
        sys.executable, "-m", "treadle.cli", "train", "--engine", "simulated", "--steps", "1000",
        "--run-dir", str(tmp_path / "run"),
    ])  # fmt: skip
    try:
        _wait_for_line(proc, "processes healthy", timeout_s=300)  # training starts: it pulls batches
        children = psutil.Process(proc.pid).children(recursive=True)
        (buffer,) = [c for c in children if "treadle.services.buffer" in c.cmdline()]
        buffer.kill()
        killed = time.monotonic()
        out, _ = proc.communicate(timeout=60)
        took = time.monotonic() - killed
        assert proc.returncode == 1, (proc.returncode, out[-3000:])
        assert "buffer exited with -9 while the run needed it" in out, out[-3000:]
        assert str(tmp_path / "run" / "buffer.log") in out, out[-3000:]
        assert took < 30, took  # the trainer's batch timeout is 300 s
        _, alive = psutil.wait_procs([c for c in children if c.pid != buffer.pid], timeout=10)
        assert not alive, [c.cmdline() for c in alive]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _start(argv: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip


def _signalled(argv: list[str], running: str, sig: signal.Signals) -> str:
    """Start ``argv``, wait for a line holding ``running``, send ``sig``; every child it started must
    be gone within 10 s. Returns what it printed."""
    proc = _start(argv)
    try:
        _wait_for_line(proc, running, timeout_s=300)
        children = psutil.Process(proc.pid).children(recursive=True)
        assert len(children) >= 5, [c.cmdline() for c in children]  # engine, agent, env, reward, buffer, ...
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=60)
        expected = -sig.value if sig == signal.SIGKILL else 128 + sig.value
        if argv[3] == "train" and sig == signal.SIGTERM:
            expected = -sig.value  # treadle train takes the default action: it dies of the signal
        assert proc.returncode == expected, (proc.returncode, out[-3000:])
        _, alive = psutil.wait_procs(children, timeout=10)
        assert not alive, [c.cmdline() for c in alive]
        return out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
