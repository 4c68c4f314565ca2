"""Start one container's process inside its pod: ``python -m treadle.devcluster.nodeagent.launch SPEC``.

The node agent starts this helper in a session of its own; it enters the pod's network namespace
(shared by the pod's containers, so they reach each other on 127.0.0.1 and two pods can bind the
same port), makes a mount and a UTS namespace of its own (the pod's hostname; ``/etc/hosts``,
``/etc/resolv.conf``, ``/etc/hostname`` and the volumes bind-mounted at their mount paths, none of it
visible outside), then ``exec``s the container's argv, which keeps this process's pid and session.

A helper process rather than a ``preexec_fn``: the agent is multi-threaded, and forking it to run
Python between fork and exec can deadlock. A failed ``exec`` (no such binary) is written to the
spec's ``error_file`` for the agent's container status and exits 127, as a shell would. The
``started_fd`` pipe closes at the ``exec`` (or the exit), so the agent reports a container running
only once its own program runs.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import sys
from pathlib import Path

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWNET = 0x40000000
MS_RDONLY, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 0x1, 0x20, 0x1000, 0x4000, 0x40000


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _mount_point(source: str, target: str) -> None:
    # A mount point missing on the host is created there (an empty directory or file): there is no
    # image root file system to create it in.
    if os.path.isdir(source):
        os.makedirs(target, exist_ok=True)
    elif not os.path.exists(target):
        os.makedirs(os.path.dirname(target), exist_ok=True)
        Path(target).touch()


def enter(spec: dict[str, object]) -> None:
    """Join the pod's network namespace, make the container's mount and UTS namespaces, mount."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    fd = os.open(str(spec["netns"]), os.O_RDONLY)
    _check(libc.setns(fd, CLONE_NEWNET), "setns(net)")
    os.close(fd)
    _check(libc.unshare(CLONE_NEWNS | CLONE_NEWUTS), "unshare(mount, uts)")
    # Private propagation: nothing mounted below reaches the host's mount table.
    _check(libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "make / private")
    hostname = str(spec["hostname"]).encode()
    _check(libc.sethostname(hostname, len(hostname)), "sethostname")
    mounts = spec["mounts"]
    assert isinstance(mounts, list)
    for source, target, read_only in sorted(mounts, key=lambda m: m[1].count("/")):
        _mount_point(source, target)
        _check(libc.mount(source.encode(), target.encode(), None, MS_BIND | MS_REC, None), f"bind {target}")
        if read_only:
            flags = MS_BIND | MS_REMOUNT | MS_RDONLY
            _check(libc.mount(None, target.encode(), None, flags, None), f"read-only {target}")


def main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[1]).read_text())
    # Closed by a successful exec (close-on-exec) or by the exit: the agent's "container started".
    os.set_inheritable(spec["started_fd"], False)
    error_file = Path(spec["error_file"])
    try:
        enter(spec)
        os.chdir(spec["cwd"])
        os.execvpe(spec["argv"][0], spec["argv"], spec["env"])
    except OSError as exc:
        error_file.write_text(f"{exc} (argv {spec['argv']!r})")
        print(f"treadle node agent: container start failed: {exc}", file=sys.stderr)
    return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv))
