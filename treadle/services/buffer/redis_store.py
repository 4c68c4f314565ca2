"""The Redis backend of the buffer (cluster mode), behind the same ``store.Store`` interface.

Created by ``python -m treadle.services.buffer --redis URL`` and by the integration tests; driven by
``BufferService``. Each operation is one Lua script, so a put, a lease, an ack or a requeue is
atomic in Redis and costs one round trip; forming a batch is serialized across buffer replicas by a
Redis lock. Every key shares the ``{namespace}`` hash tag, so in Redis Cluster all of a job's keys
live in one slot and the scripts stay valid.

Keys (``P`` = ``treadle:buf:{namespace}:``): ``P t:<id>`` payload, ``P v:<id>`` init version,
``P g:<group>`` hash (task, expected, seq, minv, arrived, completed), ``P m:<group>`` list of
``<status-initial>:<id>``, ``P pending`` zset group -> seq, ``P lease:<batch>`` groups joined by
newlines, ``P leases`` zset batch -> deadline, ``P seen`` / ``P gone`` sets, ``P stats`` and
``P reasons`` hashes, ``P seq`` counter. Trajectory and group ids may not contain newlines
(``protocol`` checks).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

import redis.asyncio as aioredis

from treadle.errors import NotFound
from treadle.policy import batching
from treadle.services.buffer import protocol, store

_PUT = """
local p = ARGV[1]
local n = tonumber(ARGV[2])
local arriving, fresh, late = {}, {}, {}
for i = 0, n - 1 do
  local o = 3 + i * 8
  local tid, gid, task, size = ARGV[o], ARGV[o + 1], ARGV[o + 2], tonumber(ARGV[o + 3])
  if redis.call('SISMEMBER', p .. 'gone', gid) == 1 then
    if redis.call('SISMEMBER', p .. 'seen', tid) == 0 then table.insert(late, tid) end
  elseif redis.call('SISMEMBER', p .. 'seen', tid) == 0 then
    local g = redis.call('HMGET', p .. 'g:' .. gid, 'task', 'expected', 'arrived')
    local gtask, gsize, arrived = task, size, 0
    if g[1] then gtask, gsize, arrived = g[1], tonumber(g[2]), tonumber(g[3]) end
    local k = (arriving[gid] or arrived) + 1
    if gtask ~= task or gsize ~= size or k > gsize then
      return {'conflict', i, gtask, gsize, k - 1}
    end
    arriving[gid] = k
    table.insert(fresh, o)
  end
end
for _, o in ipairs(fresh) do
  local tid, gid, task, size, ver = ARGV[o], ARGV[o + 1], ARGV[o + 2], ARGV[o + 3], tonumber(ARGV[o + 4])
  local status, reason, payload = ARGV[o + 5], ARGV[o + 6], ARGV[o + 7]
  local gk = p .. 'g:' .. gid
  redis.call('SADD', p .. 'seen', tid)
  redis.call('SET', p .. 't:' .. tid, payload)
  redis.call('SET', p .. 'v:' .. tid, ver)
  if redis.call('EXISTS', gk) == 0 then
    local seq = redis.call('INCR', p .. 'seq')
    redis.call('HSET', gk, 'task', task, 'expected', size, 'seq', seq, 'minv', ver)
    redis.call('HSET', gk, 'arrived', 0, 'completed', 0)
    redis.call('ZADD', p .. 'pending', seq, gid)
  elseif ver < tonumber(redis.call('HGET', gk, 'minv')) then
    redis.call('HSET', gk, 'minv', ver)
  end
  redis.call('HINCRBY', gk, 'arrived', 1)
  if status == 'completed' then redis.call('HINCRBY', gk, 'completed', 1) end
  redis.call('RPUSH', p .. 'm:' .. gid, string.sub(status, 1, 1) .. ':' .. tid)
  redis.call('HINCRBY', p .. 'stats', 'put', 1)
  redis.call('HINCRBY', p .. 'stats', status, 1)
  if status ~= 'completed' then redis.call('HINCRBY', p .. 'reasons', reason, 1) end
end
for _, tid in ipairs(late) do redis.call('SADD', p .. 'seen', tid) end
if #late > 0 then redis.call('HINCRBY', p .. 'stats', 'evicted', #late) end
return {'ok', #fresh, n - #fresh - #late}
"""

_PENDING = """
local p = ARGV[1]
local limit = tonumber(ARGV[2])
local gids = redis.call('ZRANGE', p .. 'pending', 0, limit - 1)
local out = {redis.call('ZCARD', p .. 'pending')}
for _, gid in ipairs(gids) do
  local g = redis.call('HMGET', p .. 'g:' .. gid, 'task', 'expected', 'seq', 'minv', 'arrived', 'completed')
  table.insert(out, gid)
  for _, v in ipairs(g) do table.insert(out, v) end
end
return out
"""

# ARGV: prefix, mode ('evict' | 'retire'), group ids...
_DELETE = """
local p = ARGV[1]
local mode = ARGV[2]
local n = 0
for i = 3, #ARGV do
  local gid = ARGV[i]
  if redis.call('ZREM', p .. 'pending', gid) == 1 then
    for _, m in ipairs(redis.call('LRANGE', p .. 'm:' .. gid, 0, -1)) do
      local tid = string.sub(m, 3)
      redis.call('DEL', p .. 't:' .. tid, p .. 'v:' .. tid)
      n = n + 1
    end
    redis.call('DEL', p .. 'g:' .. gid, p .. 'm:' .. gid)
    if mode == 'evict' then
      redis.call('SADD', p .. 'gone', gid)
    else
      redis.call('HINCRBY', p .. 'stats', 'retired_empty_groups', 1)
    end
  end
end
if mode == 'evict' then redis.call('HINCRBY', p .. 'stats', 'evicted', n) end
return n
"""

# ARGV: prefix, batch id, deadline, group ids...
_LEASE = """
local p = ARGV[1]
for i = 4, #ARGV do
  if not redis.call('ZSCORE', p .. 'pending', ARGV[i]) then return {'missing', ARGV[i]} end
end
local out = {'ok'}
local gids = {}
for i = 4, #ARGV do
  local gid = ARGV[i]
  redis.call('ZREM', p .. 'pending', gid)
  table.insert(gids, gid)
  for _, m in ipairs(redis.call('LRANGE', p .. 'm:' .. gid, 0, -1)) do
    if string.sub(m, 1, 1) == 'c' then
      local tid = string.sub(m, 3)
      table.insert(out, redis.call('GET', p .. 'v:' .. tid))
      table.insert(out, redis.call('GET', p .. 't:' .. tid))
    end
  end
end
redis.call('SET', p .. 'lease:' .. ARGV[2], table.concat(gids, '\\n'))
redis.call('ZADD', p .. 'leases', ARGV[3], ARGV[2])
redis.call('HINCRBY', p .. 'stats', 'delivered', (#out - 1) / 2)
return out
"""

_ACK = """
local p = ARGV[1]
local lk = p .. 'lease:' .. ARGV[2]
local groups = redis.call('GET', lk)
if not groups then return -1 end
local n = 0
for gid in string.gmatch(groups, '[^\\n]+') do
  n = n + tonumber(redis.call('HGET', p .. 'g:' .. gid, 'completed') or 0)
  for _, m in ipairs(redis.call('LRANGE', p .. 'm:' .. gid, 0, -1)) do
    local tid = string.sub(m, 3)
    redis.call('DEL', p .. 't:' .. tid, p .. 'v:' .. tid)
  end
  redis.call('DEL', p .. 'g:' .. gid, p .. 'm:' .. gid)
end
redis.call('DEL', lk)
redis.call('ZREM', p .. 'leases', ARGV[2])
redis.call('HINCRBY', p .. 'stats', 'acked', n)
return n
"""

_REQUEUE = """
local p = ARGV[1]
local moved = 0
for _, bid in ipairs(redis.call('ZRANGEBYSCORE', p .. 'leases', '-inf', ARGV[2])) do
  local lk = p .. 'lease:' .. bid
  local groups = redis.call('GET', lk) or ''
  for gid in string.gmatch(groups, '[^\\n]+') do
    local g = redis.call('HMGET', p .. 'g:' .. gid, 'seq', 'completed')
    redis.call('ZADD', p .. 'pending', g[1], gid)
    redis.call('HINCRBY', p .. 'stats', 'redelivered', g[2])
    moved = moved + 1
  end
  redis.call('DEL', lk)
  redis.call('ZREM', p .. 'leases', bid)
end
return moved
"""

_COUNT_STORED = """
local p = ARGV[1]
local n = 0
for _, gid in ipairs(redis.call('ZRANGE', p .. 'pending', 0, -1)) do
  n = n + tonumber(redis.call('HGET', p .. 'g:' .. gid, 'arrived') or 0)
end
local groups = redis.call('ZCARD', p .. 'pending')
for _, bid in ipairs(redis.call('ZRANGE', p .. 'leases', 0, -1)) do
  for gid in string.gmatch(redis.call('GET', p .. 'lease:' .. bid) or '', '[^\\n]+') do
    n = n + tonumber(redis.call('HGET', p .. 'g:' .. gid, 'arrived') or 0)
    groups = groups + 1
  end
end
return {n, groups, redis.call('ZCARD', p .. 'leases')}
"""


class RedisStore:
    """A buffer store in Redis; ``namespace`` separates jobs sharing one Redis."""

    def __init__(
        self, client: aioredis.Redis, *, namespace: str = "default", lock_timeout_s: float = 30.0
    ) -> None:
        self._r = client
        self._p = f"treadle:buf:{{{namespace}}}:"
        self._lock_timeout_s = lock_timeout_s
        self._put = client.register_script(_PUT)
        self._pending = client.register_script(_PENDING)
        self._delete = client.register_script(_DELETE)
        self._lease = client.register_script(_LEASE)
        self._ack = client.register_script(_ACK)
        self._requeue = client.register_script(_REQUEUE)
        self._count = client.register_script(_COUNT_STORED)

    @classmethod
    def from_url(cls, url: str, *, namespace: str = "default") -> RedisStore:
        # RESP2 explicitly: redis-py 8 defaults to RESP3, whose script replies differ in shape.
        return cls(aioredis.Redis.from_url(url, protocol=2), namespace=namespace)

    async def put(self, records: Sequence[protocol.Record]) -> protocol.PutResult:
        args: list[Any] = [self._p, len(records)]
        for r in records:
            args += [
                r.trajectory_id,
                r.group_id,
                r.task,
                r.group_size,
                r.init_version,
                r.status,
                r.reason,
                r.payload,
            ]
        reply = await self._put(args=args)
        if reply[0] == b"conflict":
            i = int(reply[1])
            raise store.member_error(
                i, records[i], task=reply[2].decode(), expected=int(reply[3]), arrived=int(reply[4])
            )
        return protocol.PutResult(stored=int(reply[1]), duplicates=int(reply[2]))

    @contextlib.asynccontextmanager
    async def _locked(self) -> AsyncIterator[None]:
        async with self._r.lock(self._p + "lock", timeout=self._lock_timeout_s, blocking_timeout=None):
            yield

    def lock(self) -> contextlib.AbstractAsyncContextManager[None]:
        return self._locked()

    async def pending(self, limit: int) -> tuple[list[batching.Group], bool]:
        reply = await self._pending(args=[self._p, limit])
        total = int(reply[0])
        out = []
        for k in range(1, len(reply), 7):
            gid, task, expected, seq, minv, arrived, completed = reply[k : k + 7]
            out.append(
                batching.Group(
                    group_id=gid.decode(),
                    task=task.decode(),
                    expected=int(expected),
                    seq=int(seq),
                    min_version=int(minv),
                    arrived=int(arrived),
                    completed=int(completed),
                )
            )
        return out, total > len(out)

    async def evict(self, group_ids: Sequence[str]) -> int:
        return int(await self._delete(args=[self._p, "evict", *group_ids])) if group_ids else 0

    async def retire(self, group_ids: Sequence[str]) -> int:
        return int(await self._delete(args=[self._p, "retire", *group_ids])) if group_ids else 0

    async def lease(self, group_ids: Sequence[str], *, batch_id: str, deadline: float) -> store.Leased:
        reply = await self._lease(args=[self._p, batch_id, repr(deadline), *group_ids])
        if reply[0] == b"missing":
            raise NotFound(f"group {reply[1].decode()!r} is not pending")
        versions = [int(v) for v in reply[1::2]]
        return store.Leased(payloads=list(reply[2::2]), init_versions=versions)

    async def ack(self, batch_id: str) -> int:
        n = int(await self._ack(args=[self._p, batch_id]))
        if n < 0:
            raise NotFound(
                f"batch {batch_id!r} is not leased (unknown, already acked, or expired and redelivered)"
            )
        return n

    async def requeue_expired(self, now: float) -> int:
        return int(await self._requeue(args=[self._p, repr(now)]))

    async def counters(self) -> store.Counters:
        async with self._r.pipeline(transaction=False) as pipe:
            pipe.hgetall(self._p + "stats")
            pipe.hgetall(self._p + "reasons")
            stats, reasons = await pipe.execute()
        stored, groups, leases = await self._count(args=[self._p])
        c = store.Counters(stored=int(stored), stored_groups=int(groups), leased_batches=int(leases))
        for key, value in stats.items():
            setattr(c, key.decode(), int(value))
        c.failed_by_reason = {k.decode(): int(v) for k, v in reasons.items()}
        return c

    async def aclose(self) -> None:
        await self._r.aclose()
