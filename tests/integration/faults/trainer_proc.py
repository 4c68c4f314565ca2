"""The simulated trainer (``treadle.localmode.trainer.simulated_trainer``) as a process of its own, so the
fault suite can kill it and start it again.

``python trainer_proc.py --port P --services JSON --batch-size N --trained FILE``: goes on from the
scheduler's committed version, appends the id of every row it acks to FILE (one a line, flushed
within 0.1 s), and listens on 127.0.0.1:P (serving nothing: the open port says it is up).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
from pathlib import Path

from treadle.localmode import run as run_mod
from treadle.localmode import trainer as trainer_mod
from treadle.services.scheduler import client as scheduler_client


async def main(a: argparse.Namespace) -> None:
    s = json.loads(a.services)
    services = run_mod.Services(
        scheduler=s["scheduler"], placement=s["placement"], buffer=s["buffer"], reward="", envs=[],
        agents=s["agents"], engines=s["engines"], metrics={}, token=s["token"],
    )  # fmt: skip
    scheduler = scheduler_client.SchedulerClient(services.scheduler, token=services.token)
    try:
        committed = await trainer_mod.waiting("the scheduler (Stats)", scheduler.stats)
    finally:
        await scheduler.aclose()
    out = trainer_mod.TrainerLog(version=committed.version)
    listener = socket.create_server(("127.0.0.1", a.port))
    trainer = asyncio.create_task(trainer_mod.simulated_trainer(services, batch_size=a.batch_size, out=out))
    written = 0
    with listener:
        while not trainer.done():
            await asyncio.sleep(0.1)
            _append(a.trained, out.trained[written:])
            written = len(out.trained)
    await trainer  # only an error ends it: raise it


def _append(path: Path, ids: list[str]) -> None:
    with open(path, "a") as f:
        f.writelines(f"{tid}\n" for tid in ids)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--services", required=True)
    p.add_argument("--batch-size", type=int, required=True)
    p.add_argument("--trained", type=Path, required=True)
    asyncio.run(main(p.parse_args()))
