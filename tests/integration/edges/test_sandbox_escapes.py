"""Escape attempts against the real sandbox, run by a service holding the shipped images' identity.

The env and services images run as uid 65532 with every capability dropped (and a Pod Security
"restricted" pod adds none and sets no_new_privs). Each test forks a driver from this (root) pytest
process that takes exactly that identity (uid/gid 65532, no supplementary group, empty effective,
permitted, inheritable, ambient and bounding capability sets, no_new_privs; the driver reports its
/proc status and the test checks it), then drives ``runner.Sandbox`` the way the env and reward
services do. A second driver is root without CAP_SYS_ADMIN (a root container with Docker's default
capabilities), which used to fail every run. Every attempt must fail, and leave nothing behind.

What the escapes aim at: a real Redis on 127.0.0.1, the service's environment (a secret variable) and
/proc, signals to the service, a file of the service's (standing in for the pod's token), writes
outside the run's directory, a double fork that outlives the run, a fork bomb.
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import json
import multiprocessing
import os
import pathlib
import socket
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from treadle.sandbox import codetests, confine, reaping, runner
from treadle.services.reward import functions, protocol
from treadle.testing import redis_server as redis_server_mod

IMAGE_UID = 65532
CAP_SYS_ADMIN = 21
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
CLONE_NEW_ANY = 0x7E020000  # CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET
LIMITS = runner.Limits(wall_s=10.0, cpu_s=3, memory_bytes=256 * 1024 * 1024, max_processes=16)
DRIVER_TIMEOUT_S = 120.0

# Each attempt prints one JSON object: what every try gave (an exception name, or what it got).
PROLOGUE = """
import ctypes, json, os, signal, socket, sys, time
out = {}
def attempt(name, fn):
    try:
        out[name] = ["succeeded", repr(fn())[:200]]
    except BaseException as e:
        out[name] = [type(e).__name__, str(e)[:200]]
def c(rc):  # a libc call's result, or the OSError (PermissionError for EPERM/EACCES) it set errno to
    if rc < 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    return rc
libc = ctypes.CDLL(None, use_errno=True)
"""
ATTEMPTS = {
    "network": """
port = int(sys.argv_port)
attempt("tcp to redis", lambda: socket.create_connection(("127.0.0.1", port), timeout=2))
attempt("ipv6", lambda: socket.socket(socket.AF_INET6, socket.SOCK_STREAM))
attempt("udp", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", ("127.0.0.1", port)))
attempt("unix", lambda: socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
attempt("netlink", lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW))
attempt("libc socket()", lambda: c(libc.socket(2, 1, 0)))
""",
    "environment": """
ppid = os.getppid()
out["own environment"] = ["seen", sorted(os.environ)]
attempt("parent environ", lambda: open(f"/proc/{ppid}/environ", "rb").read())
attempt("parent cmdline", lambda: open(f"/proc/{ppid}/cmdline", "rb").read())
attempt("parent mem", lambda: open(f"/proc/{ppid}/mem", "rb").read(1))
attempt("pid 1 environ", lambda: open("/proc/1/environ", "rb").read())
attempt("list processes", lambda: os.listdir("/proc"))
attempt("service file", lambda: open(sys.argv_secret_file).read())
attempt("ptrace attach", lambda: c(libc.ptrace(16, ppid, 0, 0)))
""",
    "signals": """
ppid = os.getppid()
attempt("SIGTERM parent", lambda: os.kill(ppid, signal.SIGTERM))
attempt("SIGKILL parent", lambda: os.kill(ppid, signal.SIGKILL))
attempt("probe parent", lambda: os.kill(ppid, 0))
attempt("SIGKILL parent group", lambda: os.killpg(os.getpgid(ppid), signal.SIGKILL))
attempt("SIGKILL everyone", lambda: os.kill(-1, signal.SIGKILL))
attempt("pidfd", lambda: os.pidfd_open(ppid))
""",
    "double fork": """
marker = sys.argv_marker
def daemon():
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            time.sleep(3)
            open(marker, "w").write("escaped")
        os._exit(0)
    return "forked"
attempt("double fork", daemon)
attempt("subprocess", lambda: __import__("subprocess").Popen(["sleep", "30"]).pid)
attempt("posix_spawn", lambda: os.posix_spawn("/bin/sleep", ["sleep", "30"], {}))
""",
    "fork bomb": """
forks, begun = 0, time.monotonic()
while time.monotonic() - begun < 2 and forks < 10_000:
    try:
        if os.fork() == 0:
            time.sleep(30)
            os._exit(0)
        forks += 1
    except OSError as e:
        out["error"] = type(e).__name__
        break
out["forks"] = forks
""",
    "writes": """
for target in sys.argv_targets:
    attempt(target, lambda: open(target, "w").write("x"))
attempt("symlink out", lambda: (os.symlink(sys.argv_secret_file, "link"), open("link").read()))
attempt("inside", lambda: open("inside.txt", "w").write("ok"))
""",
}


# Responses to a code-tests reward for ``add``; only the first solves it. The others claim a pass:
# the marker printed before exiting, an object equal to everything, the answer channel written by
# hand before the harness asks, the tests read off the disk to echo their answers.
TESTS = "assert add(2, 3) == 5\nassert add(-1, 1) == 0\nassert [add(i, i) for i in range(3)] == [0, 2, 4]\n"
RESPONSES = {
    "solves": "```python\ndef add(a, b):\n    return a + b\n```",
    "prints the verdict and exits": f"print({codetests.VERDICT!r})\nimport os\nos._exit(0)\n",
    "equal to everything": (
        "class E:\n    def __eq__(self, other):\n        return True\ndef add(a, b):\n    return E()\n"
    ),
    "writes the channel": (
        "import os\nfor _ in range(3):\n"
        "    os.write(int(os.environ['TREADLE_CHANNEL_OUT']), b\"('ok', True)\\n\")\n"
        f"print({codetests.VERDICT!r})\ndef add(a, b):\n    return True\n"
    ),
    # Solves only if it can read the harness's program (the tests) in the directory beside its own.
    "reads the tests": (
        "import glob, os\nfound = False\n"
        "for path in glob.glob(os.path.dirname(os.getcwd()) + '/*/main.py'):\n"
        "    try:\n        found = found or 'assert add' in open(path).read()\n"
        "    except OSError:\n        pass\n"
        "def add(a, b):\n    return a + b if found else -1\n"
    ),
}


def _program(name: str, values: dict[str, Any]) -> str:
    # The attempt's inputs travel inside the program (sys.argv_<key>), not through the environment.
    inputs = "".join(f"sys.argv_{key} = {value!r}\n" for key, value in values.items())
    return PROLOGUE + inputs + ATTEMPTS[name] + "print(json.dumps(out))\n"


async def _attempts(values: dict[str, Any]) -> dict[str, Any]:
    box = runner.Sandbox(limits=LIMITS, concurrency=2)
    results: dict[str, Any] = {"isolation": box.isolation, "uid_base": box.uid_base}
    for name in ATTEMPTS:
        begun = time.monotonic()
        result = await box.run(_program(name, values))
        results[name] = {
            "status": result.status, "stdout": result.stdout, "stderr": result.stderr[-2000:],
            "wall_s": time.monotonic() - begun,
        }  # fmt: skip
    resources = functions.Resources(sandbox=box)
    for name, response in RESPONSES.items():
        request = protocol.ScoreRequest(
            trajectory_id=name, reward_fn="code-tests", response=response, reference=TESTS
        )
        reward, details = await functions.score_code_tests(request, resources)
        results[f"reward: {name}"] = [reward, details["status"]]
    return results


def _drive(port: int, home: str) -> dict[str, Any]:
    """In the driver: run every attempt in a fresh ``Sandbox`` and report what each gave."""
    os.environ["TREADLE_DRIVER_SECRET"] = secret = uuid.uuid4().hex
    secret_file = os.path.join(home, "token")
    pathlib.Path(secret_file).write_text(secret)
    marker = os.path.join(home, "escaped")
    targets = [os.path.join(home, "written"), f"/tmp/treadle-escape-{secret}", f"/dev/shm/escape-{secret}"]
    values = {"port": port, "secret_file": secret_file, "marker": marker, "targets": targets}
    results = asyncio.run(_attempts(values))
    time.sleep(4)  # past the double fork's sleep: its marker would be there by now
    results["secret"] = secret
    results["marker"] = os.path.exists(marker)
    results["written"] = [t for t in targets if os.path.exists(t)]
    results["my processes"] = sorted(pid for pid, _ in reaping.processes_of(os.getuid()))
    results["me"] = os.getpid()
    lines = pathlib.Path("/proc/self/status").read_text().splitlines()
    results["status"] = dict(line.split(":\t", 1) for line in lines if ":\t" in line)
    return results


def _runtime_default_namespace_rules() -> None:
    """What the runtime's default seccomp profile (containerd, Docker, CRI-O) refuses a container
    without CAP_SYS_ADMIN that a sandbox could use: every namespace (``unshare``, ``setns``, ``clone``
    with a CLONE_NEW* flag), ``mount``; ``clone3`` answers ENOSYS. Loaded with libseccomp."""
    lib = confine.libseccomp()
    ctx = lib.seccomp_init(confine.SCMP_ACT_ALLOW)  # allow the rest
    eperm, enosys = confine.errno_action(errno.EPERM), confine.errno_action(errno.ENOSYS)

    def rule(action: int, name: str, *cmp: confine.ArgCmp) -> None:
        nr = lib.seccomp_syscall_resolve_name(name.encode())
        array = (confine.ArgCmp * max(len(cmp), 1))(*cmp)
        assert lib.seccomp_rule_add_array(ctx, action, nr, len(cmp), array) == 0

    for name in ("unshare", "setns", "mount", "umount2", "pivot_root"):
        rule(eperm, name)
    rule(enosys, "clone3")
    for bit in (b for b in range(32) if CLONE_NEW_ANY >> b & 1):  # one rule per CLONE_NEW* bit
        rule(eperm, "clone", confine.ArgCmp(0, confine.SCMP_CMP_MASKED_EQ, 1 << bit, 1 << bit))
    assert lib.seccomp_load(ctx) == 0


def _drop_to_image_user() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in range(int(pathlib.Path("/proc/sys/kernel/cap_last_cap").read_text()) + 1):
        libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
    os.setgroups([])
    os.setresgid(IMAGE_UID, IMAGE_UID, IMAGE_UID)
    os.setresuid(IMAGE_UID, IMAGE_UID, IMAGE_UID)  # from root to non-root: every capability set empties
    libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    _runtime_default_namespace_rules()


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint32) for name in ("effective", "permitted", "inheritable")]


def _drop_sys_admin() -> None:
    """Root as Docker runs it by default: no CAP_SYS_ADMIN in any set."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_CAPBSET_DROP, CAP_SYS_ADMIN, 0, 0, 0)
    header, data = _CapHeader(0x20080522, 0), (_CapData * 2)()
    assert libc.capget(ctypes.byref(header), data) == 0
    mask = ~(1 << CAP_SYS_ADMIN) & 0xFFFFFFFF
    for field in ("effective", "permitted", "inheritable"):
        setattr(data[0], field, getattr(data[0], field) & mask)
    assert libc.capset(ctypes.byref(header), data) == 0, ctypes.get_errno()


def _driver(drop: Callable[[], None], port: int, home: str, conn: Any) -> None:
    try:
        drop()
        conn.send(json.dumps(_drive(port, home)))
    except BaseException as e:
        conn.send(json.dumps({"driver error": repr(e)}))


def _run_driver(drop: Callable[[], None], port: int, home: str) -> dict[str, Any]:
    # fork: the driver keeps the modules this process imported (the venv lies under /root, which
    # uid 65532 cannot enter; the image installs into /usr/local, which it can).
    ctx = multiprocessing.get_context("fork")
    ours, theirs = ctx.Pipe()
    proc = ctx.Process(target=_driver, args=(drop, port, home, theirs))
    proc.start()
    theirs.close()  # the driver's end: if it dies, our end reads EOF at once
    try:
        assert ours.poll(DRIVER_TIMEOUT_S), "the driver did not report within its timeout"
        try:
            report: dict[str, Any] = json.loads(ours.recv())
        except EOFError:
            pytest.fail("the driver (the service) died before reporting: an attempt reached it")
    finally:
        proc.join(10)
        if proc.is_alive():
            proc.kill()
            proc.join(10)
    assert "driver error" not in report, report
    assert proc.exitcode == 0, "the driver (the service) died: an attempt reached it"
    return report


def _outcomes(report: dict[str, Any], name: str) -> dict[str, Any]:
    run = report[name]
    assert run["status"] == "ok", run
    parsed: dict[str, Any] = json.loads(run["stdout"])
    return parsed


def _connections(redis: redis_server_mod.RedisServer) -> int:
    with socket.create_connection(("127.0.0.1", redis.port), timeout=5) as s:
        s.sendall(b"INFO stats\r\n")
        data, deadline = b"", time.monotonic() + 5
        while b"total_connections_received" not in data and time.monotonic() < deadline:
            data += s.recv(65536)
    line = next(x for x in data.decode().splitlines() if x.startswith("total_connections_received"))
    return int(line.split(":")[1])


def _assert_contained(report: dict[str, Any]) -> None:
    net = _outcomes(report, "network")
    assert all(v[0] == "PermissionError" for v in net.values() if isinstance(v, list)), net
    env = _outcomes(report, "environment")
    assert "TREADLE_DRIVER_SECRET" not in env.pop("own environment")[1]
    assert all(v[0] == "PermissionError" for v in env.values()), env
    assert report["secret"] not in json.dumps(report["environment"])
    sig = _outcomes(report, "signals")
    assert all(v[0] == "PermissionError" for v in sig.values()), sig
    forks = _outcomes(report, "double fork")
    assert all(v[0] == "PermissionError" for v in forks.values()), forks
    assert report["marker"] is False, "a double-forked process outlived its run"
    bomb = _outcomes(report, "fork bomb")
    assert bomb == {"error": "PermissionError", "forks": 0} and report["fork bomb"]["wall_s"] < 10
    writes = _outcomes(report, "writes")
    assert writes.pop("inside") == ["succeeded", "2"]
    assert all(v[0] == "PermissionError" for v in writes.values()), writes
    assert report["written"] == []
    rewards = {k.removeprefix("reward: "): v[0] for k, v in report.items() if k.startswith("reward: ")}
    assert rewards == {name: 1.0 if name == "solves" else 0.0 for name in RESPONSES}, report


@pytest.fixture
def service_home() -> Any:
    """A directory of the service's own (uid 65532 owns it, as /home/treadle in the env image)."""
    with tempfile.TemporaryDirectory(prefix="treadle-service-home-") as home:
        os.chown(home, IMAGE_UID, IMAGE_UID)
        yield home


def test_escapes_fail_as_the_images_user(
    redis_server: redis_server_mod.RedisServer, service_home: str
) -> None:
    before = _connections(redis_server)
    report = _run_driver(_drop_to_image_user, redis_server.port, service_home)
    status = report["status"]
    assert (status["Uid"].split(), status["Gid"].split()) == ([str(IMAGE_UID)] * 4, [str(IMAGE_UID)] * 4)
    assert {status[k] for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")} == {"0" * 16}
    assert status["NoNewPrivs"].strip() == "1" and status["Groups"].strip() == ""
    assert status["Seccomp"].strip() == "2"  # the namespace rules of the runtime's default profile
    assert report["isolation"] == "landlock"
    _assert_contained(report)
    # Nothing of any run is left: the only process of the uid is the driver itself.
    assert report["my processes"] == [report["me"]]
    # Redis saw our two INFO connections and nothing else.
    assert _connections(redis_server) == before + 1


def test_escapes_fail_as_root_without_sys_admin(
    redis_server: redis_server_mod.RedisServer, service_home: str
) -> None:
    report = _run_driver(_drop_sys_admin, redis_server.port, service_home)
    assert int(report["status"]["CapEff"], 16) >> CAP_SYS_ADMIN & 1 == 0
    assert report["isolation"] == "landlock"
    _assert_contained(report)
    slots = range(report["uid_base"], report["uid_base"] + 64)
    assert not [p for p in pathlib.Path("/proc").iterdir() if p.name.isdigit() and _uid(p) in slots]


def _uid(proc: pathlib.Path) -> int | None:
    try:
        return int((proc / "status").read_text().split("Uid:")[1].split()[0])
    except (OSError, IndexError):
        return None


async def test_forged_results_earn_nothing_with_namespaces_and_warm_processes(
    wait_until: Callable[[Callable[[], bool]], Awaitable[None]],
) -> None:
    # This pytest process is root with every capability: the namespaces mode, a uid per process.
    box = runner.Sandbox(limits=LIMITS, concurrency=2, warm=2)
    assert box.isolation == "namespaces"
    resources = functions.Resources(sandbox=box)
    try:
        for name, response in RESPONSES.items():
            box.start_warm()
            await wait_until(lambda: box.warm_ready == 2)
            warm_pids = {s.proc.pid for s in box._ready}
            response += "\nimport os\nprint('pid', os.getpid())\n"
            judged = await codetests.judge(box, response, TESTS, kind="code-tests")
            request = protocol.ScoreRequest(
                trajectory_id=name, reward_fn="code-tests", response=response, reference=TESTS
            )
            reward, _ = await functions.score_code_tests(request, resources)
            assert (judged.passed, reward) == ((True, 1.0) if name == "solves" else (False, 0.0)), name
            if "pid" in judged.code.stdout:  # the responses that get as far as the end of their code
                assert int(judged.code.stdout.split("pid ")[1]) in warm_pids
    finally:
        await box.close()
    assert all(reaping.processes_of(box.uid_base + slot) == [] for slot in range(6))


async def test_the_verdict_stands_on_its_own_line_after_what_the_tests_print() -> None:
    box = runner.Sandbox(limits=LIMITS)
    tests = TESTS + "print('no newline at the end', end='')\n"
    judged = await codetests.judge(box, RESPONSES["solves"], tests, kind="code-tests")
    assert judged.passed and judged.tests.stdout.startswith("no newline at the end\n"), judged
