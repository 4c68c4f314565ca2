"""Pod networking of the process nodes: one bridge per dev cluster, one network namespace per pod.

Each dev cluster gets a Linux bridge ``tb<hash>`` holding the gateway ``10.244.K.1/24`` (the lowest
``K`` no other interface on this machine uses, chosen under a file lock so two clusters starting
at once never pick the same), and each pod a named network namespace (``ip netns``) joined to the
bridge by a veth pair, with ``eth0`` at its pod IP and a default route through the gateway. Pods of
one cluster reach each other over the bridge and the host's agent (DNS, API proxy) on the gateway.
IP forwarding is left as the machine has it (off here): nothing a pod sends leaves this machine.

Everything is done with iproute2 (``ip``), as root. ``cleanup`` removes what a cluster's agent made,
from the state it wrote, and kills any process still inside one of its pods' namespaces, so
``treadle cluster down`` leaves nothing behind even after the agent itself was killed.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import ipaddress
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

NETNS_DIR = Path("/run/netns")
LOCK_FILE = Path("/run/treadle-nodeagent.lock")
SUPERNET = "10.244.0.0/16"
SUBNETS = tuple(ipaddress.IPv4Network(f"10.244.{k}.0/24") for k in range(256))
"""The /24s of ``SUPERNET``, one per dev cluster."""


class NetworkError(RuntimeError):
    """An ``ip`` step failed; the message names the step and shows its error."""


def ip(*args: str, check: bool = True) -> str:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=False)
    if check and proc.returncode != 0:
        raise NetworkError(f"ip {' '.join(args)}: {proc.stderr.strip()}")
    return proc.stdout


def _short(*parts: str) -> str:
    return hashlib.sha1("/".join(parts).encode()).hexdigest()[:10]


@dataclass(frozen=True)
class ClusterNet:
    """The bridge and subnet of one dev cluster."""

    bridge: str
    subnet: ipaddress.IPv4Network

    @property
    def gateway(self) -> ipaddress.IPv4Address:
        return self.subnet.network_address + 1

    def to_json(self) -> str:
        return json.dumps({"bridge": self.bridge, "subnet": str(self.subnet)})

    @classmethod
    def from_json(cls, text: str) -> ClusterNet:
        doc = json.loads(text)
        return cls(bridge=doc["bridge"], subnet=ipaddress.IPv4Network(doc["subnet"]))


@contextlib.contextmanager
def _machine_lock() -> Iterator[None]:
    with open(LOCK_FILE, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _used_subnets() -> set[ipaddress.IPv4Network]:
    used = set()
    for link in json.loads(ip("-j", "-4", "addr", "show") or "[]"):
        for addr in link.get("addr_info", []):
            used.add(ipaddress.IPv4Interface(f"{addr['local']}/{addr['prefixlen']}").network)
    return used


def create_bridge(cluster: str, state: Path) -> ClusterNet:
    """Create (or find again, from ``state``) the cluster's bridge with a /24 nobody else uses."""
    if state.is_file():
        net = ClusterNet.from_json(state.read_text())
        if ip("link", "show", net.bridge, check=False):
            return net
    with _machine_lock():
        used = _used_subnets()
        subnet = next((s for s in SUBNETS if not any(s.overlaps(u) for u in used)), None)
        if subnet is None:
            raise NetworkError(f"no free /24 left in {SUPERNET} for cluster {cluster!r}")
        net = ClusterNet(bridge=bridge_name(cluster), subnet=subnet)
        ip("link", "add", net.bridge, "type", "bridge")
        ip("addr", "add", f"{net.gateway}/{subnet.prefixlen}", "dev", net.bridge)
        ip("link", "set", net.bridge, "up")
        state.parent.mkdir(parents=True, exist_ok=True)
        state.write_text(net.to_json())
    return net


def bridge_name(cluster: str) -> str:
    return f"tb{_short(cluster)}"


def netns_name(cluster: str, pod_uid: str) -> str:
    return f"treadle-{_short(cluster)}-{pod_uid}"


def create_pod_netns(cluster: str, net: ClusterNet, pod_uid: str, pod_ip: ipaddress.IPv4Address) -> Path:
    """A network namespace for one pod, on the bridge at ``pod_ip``; returns its ``/run/netns`` path."""
    name = netns_name(cluster, pod_uid)
    host_if, peer = f"tv{_short(cluster, pod_uid)}", f"tp{_short(cluster, pod_uid)}"
    ip("netns", "del", name, check=False)  # a leftover of an agent that died mid-setup
    ip("link", "del", host_if, check=False)
    ip("netns", "add", name)
    ip("link", "add", host_if, "type", "veth", "peer", "name", peer)
    ip("link", "set", peer, "netns", name)
    ip("link", "set", host_if, "master", net.bridge, "up")
    ip("-n", name, "link", "set", peer, "name", "eth0")
    ip("-n", name, "addr", "add", f"{pod_ip}/{net.subnet.prefixlen}", "dev", "eth0")
    ip("-n", name, "link", "set", "eth0", "up")
    ip("-n", name, "link", "set", "lo", "up")
    ip("-n", name, "route", "add", "default", "via", str(net.gateway))
    return NETNS_DIR / name


def netns_inode(path: Path) -> int:
    return os.stat(path).st_ino


def pids_in_netns(inode: int) -> list[int]:
    """Every process whose network namespace is the one with ``inode``: all of one pod's processes."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if os.stat(f"/proc/{entry}/ns/net").st_ino == inode:
                    pids.append(int(entry))
    return pids


def kill_netns_processes(inode: int, timeout: float = 5.0) -> None:
    """SIGKILL every process in the namespace until none is left (bounded by ``timeout``)."""
    deadline = time.monotonic() + timeout
    while pids := pids_in_netns(inode):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() > deadline:
            raise NetworkError(f"processes {pids} survive SIGKILL in network namespace {inode}")
        time.sleep(0.05)


def delete_pod_netns(cluster: str, pod_uid: str) -> None:
    ip("netns", "del", netns_name(cluster, pod_uid), check=False)
    ip("link", "del", f"tv{_short(cluster, pod_uid)}", check=False)


def cluster_netns(cluster: str) -> list[str]:
    prefix = f"treadle-{_short(cluster)}-"
    return sorted(p.name for p in NETNS_DIR.glob(prefix + "*")) if NETNS_DIR.is_dir() else []


def cleanup(cluster: str, state: Path) -> None:
    """Kill every process left in the cluster's pod namespaces, then delete the namespaces and bridge."""
    for name in cluster_netns(cluster):
        with contextlib.suppress(FileNotFoundError):
            kill_netns_processes(netns_inode(NETNS_DIR / name))
        ip("netns", "del", name, check=False)
    if state.is_file():
        net = ClusterNet.from_json(state.read_text())
        ip("link", "del", net.bridge, check=False)
        state.unlink()


def leftovers(cluster: str) -> list[str]:
    """What ``cleanup`` should have removed and is still there (empty when clean)."""
    found = [f"network namespace {n}" for n in cluster_netns(cluster)]
    if ip("link", "show", bridge_name(cluster), check=False):
        found.append(f"bridge {bridge_name(cluster)}")
    return found
