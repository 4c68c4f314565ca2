"""Cores granted per action on real sandbox processes (``treadle.sandbox.cores`` through ``runner``).

Two elastic actions queued together and granted at once run on disjoint core sets, each pinned to
exactly its grant and told the same count (``TREADLE_GRANTED_CORES`` and the thread variables); an
action alone gets every core it may have. The kind's elasticity is fitted from two measured
durations fed to the profile here (a real run's speed-up on this shared 2-core machine is noise).
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

from treadle.sandbox import cores, runner

ALLOWED = sorted(os.sched_getaffinity(0))
REPORT = (
    "import json, os, time\n"
    "start = time.time(); time.sleep(0.6)\n"
    "print(json.dumps({'cpus': sorted(os.sched_getaffinity(0)), 'start': start, 'end': time.time(),\n"
    "  'granted': os.environ.get('TREADLE_GRANTED_CORES'),\n"
    "  'threads': sorted({os.environ.get(k) for k in ('OMP_NUM_THREADS', 'MKL_NUM_THREADS',\n"
    "                                                 'OPENBLAS_NUM_THREADS')})}))\n"
)


def seen(result: runner.Result) -> dict[str, Any]:
    assert result.status == "ok", result.stderr
    parsed: dict[str, Any] = json.loads(result.stdout)
    assert parsed["granted"] == str(len(parsed["cpus"]))
    assert parsed["threads"] == [parsed["granted"]]
    return parsed


async def test_two_elastic_actions_get_disjoint_cores_and_see_their_grant() -> None:
    assert len(ALLOWED) >= 2, "two disjoint sets need two CPUs"
    manager = cores.CoreManager(upper=len(ALLOWED))
    # Amdahl with half serial: two actions queued together run side by side at half the cores each.
    manager.profile("elastic").observe(len(ALLOWED), 0.5 + 0.5 / len(ALLOWED))
    manager.profile("elastic").observe(1, 1.0)
    box = runner.Sandbox(cores=manager, concurrency=4)
    alone = seen(await box.run(REPORT, kind="elastic"))
    assert alone["cpus"] == ALLOWED  # nothing else queued: every core it may have
    blocker = await manager.acquire("hold")  # all cores busy while the two queue
    runs = [asyncio.ensure_future(box.run(REPORT, kind="elastic")) for _ in range(2)]
    for _ in range(200):  # bounded: both waiting for cores (their processes started)
        if manager.queued == 2:
            break
        await asyncio.sleep(0.01)
    assert manager.queued == 2
    manager.release(blocker, duration_s=1.0)
    a, b = (seen(r) for r in await asyncio.gather(*runs))
    assert a["start"] < b["end"] and b["start"] < a["end"]  # they overlapped
    assert set(a["cpus"]).isdisjoint(b["cpus"])
    assert len(a["cpus"]) + len(b["cpus"]) == len(ALLOWED)
    assert manager.free == len(ALLOWED)
