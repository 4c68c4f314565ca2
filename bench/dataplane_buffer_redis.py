"""Buffer throughput on real Redis: put, then get_batch + ack, in trajectories of metadata per second.

Measured, not simulated: a real redis-server on 127.0.0.1 (``treadle.testing.redis_server``), the
buffer's ``RedisStore`` + ``BufferService`` in this process (the same code ``python -m
treadle.services.buffer --redis`` serves; the gRPC hop is left out, so this is the store's figure).
Each trajectory is a full ``Trajectory`` message (ids, group, task, versions, reward, status, one
turn of ``--tokens`` token ids, logprobs and versions); its encoded size is printed as the payload.

For each of ``--trials`` rounds: put ``--trajectories`` in calls of ``--put-chunk`` (groups of
``--group-size``), then drain them with ``get_batch(--batch-size)`` + ``ack`` until empty. Reported:
put/s, get+ack/s, and the combined rate (trajectories / (put time + get time)). Target of issue 4:
>= 20,000 trajectories/s combined.

Run: ``python bench/dataplane_buffer_redis.py``; results in ``--out`` (config.json, results.json).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

import benchcli

from treadle.services.buffer import redis_store, service
from treadle.testing import redis_server as redis_server_mod
from treadle.v1 import common_pb2

TARGET_PER_S = 20_000


@dataclasses.dataclass
class Config:
    trajectories: int = dataclasses.field(default=50_000, metadata={"help": "trajectories per trial"})
    group_size: int = dataclasses.field(default=8, metadata={"help": "members per group"})
    put_chunk: int = dataclasses.field(default=256, metadata={"help": "trajectories per put call"})
    batch_size: int = dataclasses.field(default=256, metadata={"help": "trajectories per get_batch"})
    tokens: int = dataclasses.field(default=16, metadata={"help": "output tokens in the one turn"})
    trials: int = dataclasses.field(default=3, metadata={"help": "rounds (a fresh namespace each)"})
    seed: int = dataclasses.field(default=0, metadata={"help": "id prefix seed (ids are deterministic)"})
    out: str = dataclasses.field(
        default=str(Path.home() / ".cache/treadle/bench/dataplane_buffer_redis"),
        metadata={"help": "output dir"},
    )


def trajectory(i: int, cfg: Config) -> common_pb2.Trajectory:
    g = i // cfg.group_size
    t = common_pb2.Trajectory(
        trajectory_id=f"s{cfg.seed}-t{i}", group_id=f"s{cfg.seed}-g{g}", task="math", agent="solver",
        reward=1.0, status="completed", min_version=0, max_version=0, group_size=cfg.group_size,
        init_version=0,
    )  # fmt: skip
    t.turns.add(
        output_token_ids=list(range(cfg.tokens)), output_logprobs=[-0.5] * cfg.tokens,
        output_versions=[0] * cfg.tokens,
    )  # fmt: skip
    return t


async def trial(url: str, cfg: Config, trajs: list[common_pb2.Trajectory]) -> dict[str, float]:
    store = redis_store.RedisStore.from_url(url, namespace=uuid.uuid4().hex)
    svc = service.BufferService(store=store, alpha=1)
    try:
        began = time.perf_counter()
        for k in range(0, len(trajs), cfg.put_chunk):
            await svc.put(trajs[k : k + cfg.put_chunk])
        put_s = time.perf_counter() - began
        got = 0
        began = time.perf_counter()
        while got < len(trajs):
            batch = await svc.get_batch(
                batch_size=min(cfg.batch_size, len(trajs) - got), version=0, timeout_s=5
            )
            await svc.ack(batch.batch_id)
            got += len(batch.trajectories)
        get_s = time.perf_counter() - began
        stats = await svc.stats()
        assert stats.stored == 0 and stats.acked == len(trajs), stats
    finally:
        await store.aclose()
    n = len(trajs)
    return {"put_per_s": n / put_s, "get_ack_per_s": n / get_s, "combined_per_s": n / (put_s + get_s)}


async def main(cfg: Config) -> dict[str, Any]:
    trajs = [trajectory(i, cfg) for i in range(cfg.trajectories)]
    payload = statistics.mean(len(t.SerializeToString()) for t in trajs[:1000])
    rows = []
    with redis_server_mod.redis_server() as server:
        for n in range(cfg.trials):
            row = await trial(server.url, cfg, trajs)
            rows.append(row)
            print(f"trial {n}: put {row['put_per_s']:,.0f}/s  get+ack {row['get_ack_per_s']:,.0f}/s  "
                  f"combined {row['combined_per_s']:,.0f}/s")  # fmt: skip
    best = {k: max(r[k] for r in rows) for k in rows[0]}
    median = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    print(
        f"payload: {payload:.0f} bytes per trajectory (encoded Trajectory, {cfg.tokens} tokens in one turn)"
    )
    print(
        f"median of {cfg.trials}: put {median['put_per_s']:,.0f}/s, "
        f"get_batch+ack {median['get_ack_per_s']:,.0f}/s, "
        f"one after the other {median['combined_per_s']:,.0f} trajectories/s (target >= {TARGET_PER_S:,})"
    )
    return {
        "payload_bytes": payload,
        "trials": rows,
        "median": median,
        "best": best,
        "target_per_s": TARGET_PER_S,
    }


def parse() -> Config:
    return benchcli.parse(Config, __doc__)


if __name__ == "__main__":
    config = parse()
    results = asyncio.run(main(config))
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(dataclasses.asdict(config), indent=2))
    (out / "results.json").write_text(json.dumps(results, indent=2))
