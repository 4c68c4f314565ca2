"""Where the locally built Kubernetes binaries live, building them on first use."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

REQUIRED = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "kwok",
    "kwokctl",
    "helm",
)


class ToolMissing(RuntimeError):
    """A tool the dev cluster needs cannot be found or built; the message names tool, step and reason."""


def _build_script() -> Path:
    return Path(__file__).resolve().parents[2] / "hack" / "build-k8s.sh"


def bin_dir() -> Path:
    """The directory holding every binary in ``REQUIRED``.

    ``TREADLE_K8S_BIN`` wins; otherwise ``hack/build-k8s.sh`` of this checkout builds (first run,
    slow) or finds them in the cache and prints the directory.
    """
    if env := os.environ.get("TREADLE_K8S_BIN"):
        found = Path(env)
    else:
        script = _build_script()
        if not script.is_file():
            raise ToolMissing(
                f"kubernetes binaries: step 'locate build script' failed: {script} does not exist; "
                "set TREADLE_K8S_BIN to a directory holding " + ", ".join(REQUIRED)
            )
        proc = subprocess.run(["bash", str(script)], capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise ToolMissing(proc.stderr.strip() or f"{script} exited {proc.returncode}")
        found = Path(proc.stdout.strip().splitlines()[-1])
    missing = [b for b in REQUIRED if not os.access(found / b, os.X_OK)]
    if missing:
        names = ", ".join(missing)
        raise ToolMissing(f"kubernetes binaries: step 'check {found}' failed: not executable: {names}")
    return found


def kube_version(bins: Path) -> str:
    """The version kube-apiserver was stamped with (``vX.Y.Z``)."""
    out = subprocess.run(
        [str(bins / "kube-apiserver"), "--version"], capture_output=True, text=True, check=True
    ).stdout
    match = re.search(r"v\d+\.\d+\.\d+", out)
    if match is None:
        raise ToolMissing(f"kube-apiserver: step 'read version' failed: unexpected output {out!r}")
    return match.group(0)
