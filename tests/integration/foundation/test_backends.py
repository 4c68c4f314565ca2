"""Smoke tests of the real backing services the other tiers build on."""

from __future__ import annotations

import os
import subprocess
import sys

import psutil
import pytest
import redis

from treadle.testing import mooncake_master as mooncake_master_mod
from treadle.testing import procs
from treadle.testing import redis_server as redis_server_mod


def test_redis_server_answers_on_loopback(redis_server: redis_server_mod.RedisServer) -> None:
    client = redis.Redis(host=redis_server.host, port=redis_server.port, protocol=3)
    try:
        assert client.ping() is True
        client.set("treadle:smoke", b"ok")
        assert client.get("treadle:smoke") == b"ok"
        assert client.delete("treadle:smoke") == 1
    finally:
        client.close()


def test_mooncake_store_round_trip_through_real_master(
    mooncake_master: mooncake_master_mod.MooncakeMaster, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in mooncake_master_mod.LOOPBACK_ENV.items():
        monkeypatch.setitem(os.environ, key, value)
    from mooncake.store import MooncakeDistributedStore

    store = MooncakeDistributedStore()
    rc = store.setup(
        "127.0.0.1",
        mooncake_master.metadata_url,
        32 << 20,
        8 << 20,
        "tcp",
        "",
        mooncake_master.master_address,
    )
    assert rc == 0
    try:
        payload = bytes(range(256)) * 1024
        assert store.put("treadle/smoke", payload) == 0
        assert store.get("treadle/smoke") == payload
        assert store.get("treadle/missing") == b""  # Mooncake signals a missing key with b''
        # A read leases the object for --default_kv_lease_ttl, so remove one that was not read.
        assert store.put("treadle/unread", b"x") == 0
        assert store.remove("treadle/unread") == 0
        assert store.is_exist("treadle/unread") == 0
    finally:
        store.close()


def test_server_that_dies_at_start_reports_its_log() -> None:
    with pytest.raises(procs.ServerFailed, match="exited with"):  # noqa: SIM117
        with procs.running("false", ["false"], lambda: False, timeout=5):
            pass


def test_mooncake_master_listens_on_loopback_only(
    mooncake_master: mooncake_master_mod.MooncakeMaster,
) -> None:
    assert procs.port_open(mooncake_master.rpc_port, "127.0.0.1")
    with open(f"/proc/{mooncake_master.pid}/net/tcp") as f:
        listening = [line.split() for line in f.readlines()[1:] if line.split()[3] == "0A"]
    own_ports = {mooncake_master.rpc_port, mooncake_master.metadata_port, mooncake_master.metrics_port}
    for fields in listening:
        address, port = fields[1].split(":")
        if int(port, 16) in own_ports:
            assert address == "0100007F", f"port {int(port, 16)} listens on {address}, not 127.0.0.1"


def test_a_server_does_not_outlive_a_killed_test() -> None:
    """A test process SIGKILLed inside ``procs.running`` (as a timeout kills it) leaves no server behind:
    the watchdog stops the server's whole group, a child it forked included (as vLLM forks EngineCore)."""
    port = procs.free_port()
    server = (
        "import socket, subprocess, sys, time; s = socket.socket(); s.bind(('127.0.0.1', int(sys.argv[1])));"
        " s.listen(); subprocess.Popen(['sleep', '300']); time.sleep(300)"
    )
    test = (
        "import sys, time; from treadle.testing import procs\n"
        f"argv = [sys.executable, '-c', {server!r}, '{port}']\n"
        f"with procs.running('srv', argv, lambda: procs.port_open({port})) as p:\n"
        "    print(p.pid, flush=True); time.sleep(300)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", test], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        group = int(proc.stdout.readline())
        members = [p for p in psutil.process_iter() if _group(p) == group]
        assert len(members) == 2, members  # the server and the child it forked
        proc.kill()
        proc.wait()
        _, alive = psutil.wait_procs(members, timeout=15)
        assert not alive, [p.cmdline() for p in alive]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _group(p: psutil.Process) -> int:
    try:
        return os.getpgid(p.pid)
    except ProcessLookupError:
        return -1
