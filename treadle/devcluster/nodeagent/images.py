"""Which local runtime stands in for a container image on a process node (pure).

There is no registry and no image store here: each image the dev cluster runs is mapped to what is
installed on this machine. Treadle's images (operator, services, env, inference) all map to
Treadle's virtualenv, whose ``python`` has Treadle, its extras and vLLM for CPU installed; the
chart's Redis maps to the Debian ``redis-server``. The container's ``command`` and ``args`` run
unchanged, as the operator rendered them; an image without an entry here is refused with a reason
the pod status shows (``ErrImageNeverPull``-like), not run some other way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath


@dataclass(frozen=True)
class Image:
    """What the node agent knows of an image: its ENTRYPOINT and CMD (from ``images/*/Dockerfile``)."""

    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    treadle_venv: bool = True
    """Whether the image's Python is Treadle's virtualenv (else only the system PATH)."""
    preload_openmp: bool = False
    """vLLM's CPU build: the image preloads the virtualenv's Intel OpenMP runtime (``LD_PRELOAD``), as
    vLLM's own CPU image does; without it torch and vLLM's kernels load two OpenMP runtimes."""


_SERVICES = Image(cmd=("python", "-m", "treadle.services.scheduler", "--host", "0.0.0.0", "--port", "50051"))
_VLLM = Image(entrypoint=("python", "-m", "vllm.entrypoints.openai.api_server"), preload_openmp=True)
# Keyed by repository (the image name without tag or digest).
IMAGES: Mapping[str, Image] = {
    "ghcr.io/treadle-dev/treadle-operator": Image(("treadle",), ("operator", "run", "--all-namespaces")),
    "ghcr.io/treadle-dev/treadle-services": _SERVICES,
    "ghcr.io/treadle-dev/treadle-env": Image(cmd=("python", "-m", "treadle.services.env", "--host", "0.0.0.0",
                                                  "--port", "8000")),
    "ghcr.io/treadle-dev/treadle-vllm": _VLLM,
    "vllm/vllm-openai": _VLLM,
    "docker.io/vllm/vllm-openai": _VLLM,
    # The chart's Redis: the Debian redis-server that hack/setup.sh installs.
    "redis": Image(entrypoint=("redis-server",), treadle_venv=False),
    "docker.io/library/redis": Image(entrypoint=("redis-server",), treadle_venv=False),
}  # fmt: skip


class ImageUnknown(ValueError):
    """The node agent has no local runtime for this image; the message names the image."""


@dataclass(frozen=True)
class Host:
    """What this machine offers the images: Treadle's virtualenv and checkout, the system PATH."""

    venv_bin: str
    """Treadle's virtualenv ``bin``: first on the PATH of Treadle's images (its ``python``, ``treadle``)."""
    source_root: str
    """The checkout whose ``treadle`` package Treadle's images run (``PYTHONPATH``), as images/ copy it."""
    system_path: str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class Runtime:
    """How a container of one image starts: its argv and the environment the image gives it."""

    argv: tuple[str, ...]
    env: Mapping[str, str]


def repository(image: str) -> str:
    """``image`` without its tag or digest (``redis:7.4-alpine`` -> ``redis``)."""
    name = image.split("@", 1)[0]
    slash = name.rfind("/")
    colon = name.rfind(":")
    return name[:colon] if colon > slash else name


def resolve(image: str, command: Sequence[str] | None, args: Sequence[str] | None, host: Host) -> Runtime:
    """The argv of a container as Kubernetes builds it (command replaces the ENTRYPOINT, args the CMD)."""
    known = IMAGES.get(repository(image))
    if known is None:
        names = ", ".join(sorted(IMAGES))
        raise ImageUnknown(f"image {image!r} has no local runtime on this process node (known: {names})")
    # Kubernetes: command replaces the ENTRYPOINT and drops the CMD; args replaces the CMD.
    argv = (tuple(command) if command else known.entrypoint) + (
        tuple(args) if args else () if command else known.cmd
    )
    if not known.treadle_venv:
        return Runtime(argv=argv, env={"PATH": host.system_path})
    env = {"PATH": f"{host.venv_bin}:{host.system_path}", "PYTHONPATH": host.source_root}
    if known.preload_openmp:
        env["LD_PRELOAD"] = str(PurePosixPath(host.venv_bin).parent / "lib" / "libiomp5.so")
    return Runtime(argv=argv, env=env)
