"""The sandbox's CPU cap per run and its warm processes, on real subprocesses, then through the env service.

A run pinned to N CPUs sees exactly N in its affinity and N in the thread-pool variables; a warm
process is the one a run takes (its pid), it is refilled, and what the code sees is the same as from a
process started for the run.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Awaitable, Callable

import httpx

from treadle.sandbox import reaping, runner
from treadle.services.env import client as env_client
from treadle.services.env import http_app as env_app
from treadle.services.httputil import serve

WaitUntil = Callable[[Callable[[], bool]], Awaitable[None]]  # the edges conftest's ``wait_until``

ALLOWED = sorted(os.sched_getaffinity(0))
REPORT = (
    "import json, os, resource, sys\n"
    "print(json.dumps({'cpus': sorted(os.sched_getaffinity(0)), 'pid': os.getpid(),\n"
    "  'threads': {k: os.environ.get(k)\n"
    "              for k in ('OMP_NUM_THREADS', 'MKL_NUM_THREADS', 'OPENBLAS_NUM_THREADS')},\n"
    "  'env': sorted(os.environ), 'files': sorted(os.listdir('.')), 'uid': os.getuid() != 0,\n"
    "  'as': resource.getrlimit(resource.RLIMIT_AS), 'stdin': sys.stdin.read()}))\n"
)


def report(result: runner.Result) -> dict[str, object]:
    assert result.status == "ok", result.stderr
    parsed: dict[str, object] = json.loads(result.stdout)
    return parsed


async def test_one_cpu_per_action_sees_exactly_one_cpu() -> None:
    seen = report(await runner.Sandbox(cpus=1).run(REPORT))
    assert len(seen["cpus"]) == 1 and seen["cpus"][0] in ALLOWED  # type: ignore[arg-type,index]
    assert seen["threads"] == dict.fromkeys(runner.THREAD_VARS, "1")


async def test_more_cpus_than_the_pod_has_means_all_of_them() -> None:
    seen = report(await runner.Sandbox(cpus=len(ALLOWED) + 3).run(REPORT))
    assert seen["cpus"] == ALLOWED
    assert seen["threads"] == dict.fromkeys(runner.THREAD_VARS, str(len(ALLOWED)))


async def test_without_a_cap_a_run_sees_every_cpu_and_no_thread_variables() -> None:
    seen = report(await runner.Sandbox().run(REPORT))
    assert seen["cpus"] == ALLOWED and seen["threads"] == dict.fromkeys(runner.THREAD_VARS)


async def test_concurrent_runs_spread_over_the_cpus() -> None:
    box = runner.Sandbox(cpus=1, concurrency=len(ALLOWED))
    hold = REPORT + "import time; time.sleep(0.5)\n"
    results = await asyncio.gather(*(box.run(hold) for _ in ALLOWED))
    assert sorted(report(r)["cpus"][0] for r in results) == ALLOWED  # type: ignore[index]


async def test_a_run_takes_a_warm_process_and_the_pool_refills(wait_until: WaitUntil) -> None:
    box = runner.Sandbox(cpus=1, concurrency=2, warm=2)
    try:
        box.start_warm()
        await wait_until(lambda: box.warm_ready == 2)
        warm_pids = {s.proc.pid for s in box._ready}
        first = report(await box.run(REPORT, stdin="hello"))
        assert first["pid"] in warm_pids
        await wait_until(lambda: box.warm_ready == 2)
        # other limits than the sandbox's: the run starts its own process, the pool stays
        ready_pids = {s.proc.pid for s in box._ready}
        other = report(await box.run(REPORT, limits=runner.Limits(cpu_s=2)))
        assert other["pid"] not in ready_pids and box.warm_ready == 2
    finally:
        await box.close()
    assert box.warm_ready == 0
    if box.isolation == "namespaces":
        assert all(reaping.processes_of(box.uid_base + slot) == [] for slot in range(4))


async def test_warm_and_fresh_processes_look_the_same_to_the_code(wait_until: WaitUntil) -> None:
    warm, cold = runner.Sandbox(cpus=1, warm=1), runner.Sandbox(cpus=1)
    try:
        warm.start_warm()
        await wait_until(lambda: warm.warm_ready == 1)
        a = report(await warm.run(REPORT, stdin="same\ninput"))
        b = report(await cold.run(REPORT, stdin="same\ninput"))
    finally:
        await warm.close()
    for seen in (a, b):
        del seen["pid"], seen["cpus"]  # which CPU and pid differ run to run either way
    assert a == b and a["stdin"] == "same\ninput" and a["files"] == ["main.py"]


async def test_env_service_python_code_with_a_warm_pool_behaves_as_without(wait_until: WaitUntil) -> None:
    attempts = [
        "```python\ndef add(a, b):\n    return a - b\n```",
        "```python\ndef add(a, b):\n    return a + b\n```",
    ]
    episodes = []
    for warm_pool in (0, 2):
        app = env_app.build_app(step_timeout_s=10.0, warm_pool=warm_pool, cpus_per_action=1)
        box = app.state.svc.context.sandbox
        async with serve.running(app) as url:
            await wait_until(lambda: box.warm_ready == warm_pool)  # noqa: B023 (awaited in this iteration)
            c = env_client.EnvClient(url)
            first = await c.open(env="python-code", session_id="s", seed=0, options={"max_turns": 2})
            steps = [await c.step("s", a) for a in attempts]
            await wait_until(lambda: box.warm_ready == warm_pool)  # noqa: B023
            async with httpx.AsyncClient() as h:
                text = (await h.get(f"{url}/metrics")).text
            assert f'treadle_env_warm_ready{{env="python-code"}} {float(warm_pool)}' in text
            await c.aclose()
        episodes.append((first.model_dump(), [s.model_dump() for s in steps]))
    assert episodes[0] == episodes[1]
    assert episodes[1][1][-1]["done"] and episodes[1][1][-1]["info"]["passed"] is True
