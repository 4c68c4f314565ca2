"""Escape attempts against the real sandbox: each is contained and reported with a clear status."""

from __future__ import annotations

import ast
import os
import pathlib
import uuid

import pytest

from treadle.sandbox import reaping, runner

LIMITS = runner.Limits(wall_s=5.0, cpu_s=2, memory_bytes=256 * 1024 * 1024, max_processes=16)


@pytest.fixture
def sandbox() -> runner.Sandbox:
    return runner.Sandbox(limits=LIMITS, concurrency=2)


async def test_plain_code_runs_with_stdin(sandbox: runner.Sandbox) -> None:
    result = await sandbox.run("import sys\nprint(sys.stdin.read().upper())", stdin="hello")
    assert (result.status, result.exit_code, result.stdout) == ("ok", 0, "HELLO\n")


async def test_code_reading_fd_0_gets_all_of_stdin(sandbox: runner.Sandbox) -> None:
    # The go line that starts a run must not take the run's stdin into a buffer fd 0 readers miss.
    result = await sandbox.run("import os\nprint(open(0).read().split())", stdin="1 2 3\n4 5 6\n")
    assert (result.status, result.stdout) == ("ok", "['1', '2', '3', '4', '5', '6']\n")


async def test_socket_is_blocked(sandbox: runner.Sandbox) -> None:
    code = (
        "import socket\n"
        "s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)\n"
        "s.settimeout(2)\n"
        "s.connect(('1.1.1.1', 80))\n"
    )
    result = await sandbox.run(code)
    assert result.status == "error"
    # namespaces: no route in the empty network namespace; fallback: the socket constructor refuses
    assert "Network is unreachable" in result.stderr or "network access is disabled" in result.stderr


async def test_loopback_services_of_the_host_are_unreachable(sandbox: runner.Sandbox) -> None:
    if sandbox.isolation != "namespaces":
        pytest.skip("loopback isolation needs a network namespace (root)")
    import socket

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        code = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
        result = await sandbox.run(code)
    assert result.status == "error" and ("unreachable" in result.stderr or "refused" in result.stderr)


async def test_fork_bomb_is_contained(sandbox: runner.Sandbox) -> None:
    code = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    result = await sandbox.run(code)
    assert result.status in ("timeout", "cpu_limit")
    if sandbox.isolation == "namespaces":
        # every process of the run's uid is killed and reaped (no zombies left holding RLIMIT_NPROC)
        uids = (sandbox.uid_base, sandbox.uid_base + 1)
        assert reaping.processes_of(uids[0]) == [] and reaping.processes_of(uids[1]) == []
    after = await sandbox.run("print('next run starts fine')")
    assert after.ok


def exists(path: str) -> bool:
    return os.path.exists(path)


async def test_infinite_loop_hits_cpu_limit() -> None:
    # A generous wall clock so that the CPU limit decides even on a loaded 2-core machine.
    box = runner.Sandbox(limits=runner.Limits(cpu_s=1, wall_s=30))
    result = await box.run("while True:\n    pass\n")
    assert result.status == "cpu_limit" and result.exit_code is not None and result.exit_code < 0


async def test_sleeping_forever_hits_wall_clock() -> None:
    box = runner.Sandbox(limits=runner.Limits(wall_s=0.5))
    result = await box.run("import time\ntime.sleep(60)\n")
    assert result.status == "timeout" and result.wall_s < 5


async def test_eating_memory_hits_memory_limit(sandbox: runner.Sandbox) -> None:
    result = await sandbox.run("x = bytearray(1024 * 1024 * 1024)\n")
    assert result.status == "memory_limit" and "MemoryError" in result.stderr


async def test_output_flood_is_capped() -> None:
    box = runner.Sandbox(limits=runner.Limits(max_output_bytes=10_000))
    result = await box.run("while True:\n    print('x' * 1000)\n")
    assert result.status == "output_limit" and len(result.stdout) <= 10_000


async def test_writes_outside_the_working_directory_do_not_land(sandbox: runner.Sandbox) -> None:
    marker = f"treadle-escape-{uuid.uuid4().hex}"
    targets = [f"/tmp/{marker}", f"/var/tmp/{marker}", str(pathlib.Path.cwd() / marker), f"/root/{marker}"]
    code = "\n".join(
        ["import os", "results = []"]
        + [
            f"try:\n    open({t!r}, 'w').write('x')\n    results.append('wrote')\nexcept OSError as e:\n"
            f"    results.append(type(e).__name__)"
            for t in targets
        ]
        + ["open('inside.txt', 'w').write('ok')", "print(results)"]
    )
    result = await sandbox.run(code)
    assert result.status == "ok", result.stderr
    for target in targets:
        assert not exists(target), f"{target} escaped the sandbox"
    if sandbox.isolation == "namespaces":
        # /tmp and /var/tmp are private tmpfs (writes vanish); /root is not writable; the repo is
        # not writable, or not even there when the checkout itself lives under /tmp (as CI's may).
        tmp, var_tmp, repo, root = ast.literal_eval(result.stdout.strip())
        assert (tmp, var_tmp, root) == ("wrote", "wrote", "PermissionError")
        assert repo in {"PermissionError", "FileNotFoundError"}


async def test_working_directory_is_thrown_away(sandbox: runner.Sandbox) -> None:
    result = await sandbox.run("import os\nprint(os.getcwd())\nopen('f', 'w').write('x')\n")
    assert result.ok and not exists(result.stdout.strip())
