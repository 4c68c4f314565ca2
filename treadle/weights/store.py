"""A dedicated Mooncake store process: mounts a memory segment into the pool and holds it.

Started as ``python -m treadle.weights.store`` or ``treadle weights store`` (one per store pod in a
cluster, two or more on loopback in tests). Published weights live in these processes' memory,
never in the trainer's: the trainer and readers are pure clients (``MooncakeStore``), so a trainer
that dies takes no version with it. The process prints one ``ready`` line once its segment is
mounted, then waits for SIGTERM/SIGINT and unmounts cleanly (a SIGKILLed store drops out of the
pool when the master's client TTL expires; its objects' other replicas keep serving).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import ctypes
import os
import re
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from treadle import errors
from treadle.api import env_vars
from treadle.weights import mooncake_client

_UNITS = {"": 1, "b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}


def parse_size(text: str) -> int:
    """'4GiB', '512MiB', '1048576' -> bytes."""
    match = re.fullmatch(r"\s*(\d+)\s*([KMGT]iB|B)?\s*", text, flags=re.IGNORECASE)
    if match is None:
        raise errors.SpecError(
            "expected an integer with an optional KiB/MiB/GiB/TiB unit", field="size", value=text
        )
    return int(match.group(1)) * _UNITS[(match.group(2) or "").lower()]


def add_arguments(parser: argparse.ArgumentParser, environ: Mapping[str, str] = os.environ) -> None:
    parser.add_argument(
        "--master",
        default=environ.get(env_vars.MOONCAKE_MASTER),
        help=f"mooncake_master RPC address, host:port (${env_vars.MOONCAKE_MASTER})",
    )
    parser.add_argument(
        "--metadata", default=environ.get(env_vars.MOONCAKE_METADATA_URL),
        help=f"metadata URL, e.g. http://host:port/metadata (${env_vars.MOONCAKE_METADATA_URL})",
    )  # fmt: skip
    parser.add_argument(
        "--segment", default="4GiB", help="memory this store lends to the pool (default 4GiB)"
    )
    parser.add_argument(
        "--hostname", default=None,
        help="address announced to peers; default 127.0.0.1, or this pod's IP when --host is a wildcard",
    )  # fmt: skip
    parser.add_argument("--protocol", default="tcp", help="transfer protocol (tcp, rdma, ...)")
    parser.add_argument("--host", default="127.0.0.1", help="where --port's health service listens")
    parser.add_argument(
        "--port", type=int, default=None,
        help="serve the standard gRPC health service here, SERVING once the segment is mounted (pod probes)",
    )  # fmt: skip


def run(args: argparse.Namespace) -> int:
    for value, flag, var in (
        (args.master, "--master", env_vars.MOONCAKE_MASTER),
        (args.metadata, "--metadata", env_vars.MOONCAKE_METADATA_URL),
    ):
        if not value:
            print(f"treadle weights store: not set: pass {flag} or set {var}", file=sys.stderr)
            return 2
    try:
        segment = parse_size(args.segment)
    except errors.SpecError as exc:
        print(f"--segment: {exc}", file=sys.stderr)
        return 2
    wildcard = args.host in ("0.0.0.0", "::", "")
    # The kubelet writes the pod's IP for its hostname into /etc/hosts; peers pull from that address.
    hostname = args.hostname or (socket.gethostbyname(socket.gethostname()) if wildcard else "127.0.0.1")
    config = mooncake_client.MooncakeConfig(
        master_address=args.master,
        metadata_url=args.metadata,
        local_hostname=hostname,
        protocol=args.protocol,
    )
    # Block the signals before mounting so one arriving during setup is not lost, and before the health
    # server's threads start, so they inherit the mask and the signal reaches sigwait below.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    health_server = None if args.port is None else _HealthServer(args.host, args.port)
    try:
        client = mooncake_client.connect(config, segment_bytes=segment)
    except errors.Unavailable as exc:
        print(f"treadle weights store: {exc}", file=sys.stderr)
        return 1
    if health_server is not None:
        health_server.serving()
    print(f"ready segment_bytes={segment} master={args.master} hostname={hostname}", flush=True)
    received = signal.sigwait({signal.SIGTERM, signal.SIGINT})
    print(f"stopping on {signal.Signals(received).name}", flush=True)
    if health_server is not None:
        health_server.stop()
    client.close()
    return 0


class _HealthServer:
    """gRPC health for the pod's probes: NOT_SERVING until the segment is mounted, then SERVING."""

    def __init__(self, host: str, port: int) -> None:
        self.checker = health.HealthServicer()
        self.checker.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        self.server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=2))
        health_pb2_grpc.add_HealthServicer_to_server(self.checker, self.server)
        if self.server.add_insecure_port(f"{host}:{port}") == 0:
            raise errors.Unavailable(f"cannot listen on {host}:{port}")
        self.server.start()

    def serving(self) -> None:
        self.checker.set("", health_pb2.HealthCheckResponse.SERVING)

    def stop(self) -> None:
        self.checker.enter_graceful_shutdown()
        self.server.stop(grace=1.0)


@contextlib.contextmanager
def spawned(
    master: str, metadata: str, *, segment: str = "256MiB", hostname: str = "127.0.0.1", timeout: float = 30.0
) -> Iterator[subprocess.Popen[bytes]]:
    """A store process on this machine until the block exits (SIGTERM then SIGKILL on the way out).

    For tests, benchmarks and single-machine setups; in a cluster each store is its own pod.
    Returns once the segment is mounted. Mooncake's own (verbose) log goes to a temporary file
    that is quoted if the process fails to start.
    """
    with tempfile.TemporaryDirectory(prefix="treadle-store-") as tmp:
        log_path = Path(tmp) / "log"
        with open(log_path, "wb") as log:
            argv = [sys.executable, "-m", "treadle.weights.store", "--master", master, "--metadata", metadata,
                    "--segment", segment, "--hostname", hostname]  # fmt: skip
            env = {**os.environ, "MC_TCP_BIND_ADDRESS": hostname}
            proc = subprocess.Popen(
                argv,
                stdout=subprocess.PIPE,
                stderr=log,
                env=env,
                start_new_session=True,
                preexec_fn=die_with_parent,
            )
            try:
                _wait_ready(proc, log_path, timeout)
                yield proc
            finally:
                if proc.poll() is None:
                    proc.terminate()
                    try:
                        proc.wait(5.0)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        proc.wait()
                assert proc.stdout is not None
                proc.stdout.close()


def die_with_parent() -> None:
    """In the child before exec: SIGTERM when the spawning thread dies (PR_SET_PDEATHSIG), so a
    SIGKILLed or OOM-killed test or benchmark does not leave stores holding gigabytes behind (and a
    killed reward gateway no vLLM engines, ``services.reward.gpus``)."""
    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def _wait_ready(proc: subprocess.Popen[bytes], log_path: Path, timeout: float) -> None:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if sel.select(timeout=0.1):
                line = proc.stdout.readline()
                if line.startswith(b"ready"):
                    return
                if not line:
                    break
    proc.kill()
    proc.wait()
    tail = log_path.read_text(errors="replace")[-2000:]
    raise errors.Unavailable(f"store process did not mount its segment (exit {proc.returncode}): {tail}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m treadle.weights.store", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
