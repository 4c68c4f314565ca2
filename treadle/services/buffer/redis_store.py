"""The Redis backend of the buffer (cluster mode), behind the same ``store.Store`` interface.

Created by ``python -m treadle.services.buffer --redis URL`` and by the integration tests; driven by
``BufferService``. Each operation is one Lua script, so a put, a lease, an ack or a requeue is
atomic in Redis and costs one round trip; forming a batch is serialized across buffer replicas by a
Redis lock. Every key shares the ``{namespace}`` hash tag, so in Redis Cluster all of a job's keys
live in one slot and the scripts stay valid; each script declares one key of that slot (``KEYS[1]``,
unused by the script) so a cluster-aware client or proxy routes it to the slot's node.

Redis unreachable is ``errors.Unavailable`` and Redis full (``maxmemory`` with ``noeviction``, as
the chart runs it) is ``errors.Overloaded``: the buffer refuses with a message saying so, and a
refused call stored and changed nothing, so callers retry it whole. The put script, the only one
that grows the store, carries Redis 7's default script flags, so a full Redis refuses it before it
runs (never halfway); the scripts that drain the store (lease, ack, requeue, evict) and the batch
lock run with ``allow-oom``: a full buffer must still hand out batches and take acks, since they
are what free memory. The two read-only scripts are ``no-writes``.

Keys (``P`` = ``treadle:buf:{namespace}:``): ``P t:<id>`` payload, ``P g:<group>`` hash (task,
agent, expected, seq, minv, arrived, completed), ``P m:<group>`` list of ``<status-initial>:<id>``,
``P pending`` zset group -> seq, ``P pa:<agent>`` the same zset for one agent's experience table
(FlexMARL; kept in step with ``P pending`` by every script), ``P lease:<batch>`` groups joined by
newlines, ``P leases`` zset batch -> deadline, ``P seen`` / ``P gone`` sets, ``P stats`` and
``P reasons`` hashes, ``P seq`` counter, ``P pipeline`` the micro-batch pipeline's state (JSON,
written by the lease, ack and requeue scripts that go with it). Ids and task names hold no control
characters (``protocol`` checks), so newlines and ``\x1f`` can separate them.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from typing import Any, ParamSpec, TypeVar

import redis.asyncio as aioredis
import redis.asyncio.lock
import redis.exceptions

from treadle import errors
from treadle.errors import NotFound
from treadle.policy import batching
from treadle.services.buffer import protocol, store

# ARGV: prefix, n, then per record: meta ("tid US gid US task US size US version US status US agent US
# reason", US = \x1f; ids, task and agent hold no control characters, the reason comes last) and the
# payload.
_PUT = """#!lua
local p = ARGV[1]
local n = tonumber(ARGV[2])
local meta = {}
for i = 0, n - 1 do
  local m, k = {}, 1
  for field in string.gmatch(ARGV[3 + i * 2] .. '\\31', '([^\\31]*)\\31') do
    m[k] = field
    k = k + 1
  end
  meta[i] = m
end
-- validate everything first (a conflict stores nothing), reading each group once
local groups, order, fresh, late = {}, {}, {}, {}
for i = 0, n - 1 do
  local m = meta[i]
  local tid, gid, task, size, agent = m[1], m[2], m[3], tonumber(m[4]), m[7]
  if redis.call('SISMEMBER', p .. 'gone', gid) == 1 then
    if redis.call('SISMEMBER', p .. 'seen', tid) == 0 then table.insert(late, tid) end
  elseif redis.call('SISMEMBER', p .. 'seen', tid) == 0 then
    local g = groups[gid]
    if not g then
      local h = redis.call('HMGET', p .. 'g:' .. gid, 'task', 'expected', 'arrived', 'minv', 'agent')
      if h[1] then
        g = {new = false, task = h[1], size = tonumber(h[2]), arrived = tonumber(h[3]), minv = tonumber(h[4]),
             agent = h[5] or ''}
      else
        g = {new = true, task = task, size = size, arrived = 0, minv = tonumber(m[5]), agent = agent}
      end
      g.add, g.completed, g.members = 0, 0, {}
      groups[gid] = g
      table.insert(order, gid)
    end
    if g.task ~= task or g.agent ~= agent or g.size ~= size or g.arrived + g.add + 1 > g.size then
      return {'conflict', i, g.task, g.size, g.arrived + g.add, g.agent}
    end
    g.add = g.add + 1
    table.insert(fresh, i)
  end
end
-- then write, one call per group and per kind of key rather than per trajectory
local seen, payloads = {}, {}
local count = {put = 0, completed = 0, failed = 0, aborted = 0}
local reasons = {}
for _, i in ipairs(fresh) do
  local m = meta[i]
  local tid, g, ver, status = m[1], groups[m[2]], tonumber(m[5]), m[6]
  table.insert(seen, tid)
  table.insert(payloads, p .. 't:' .. tid)
  table.insert(payloads, ARGV[4 + i * 2])
  table.insert(g.members, string.sub(status, 1, 1) .. ':' .. tid)
  if ver < g.minv then g.minv = ver end
  if status == 'completed' then g.completed = g.completed + 1 end
  count.put = count.put + 1
  count[status] = count[status] + 1
  if status ~= 'completed' then reasons[m[8]] = (reasons[m[8]] or 0) + 1 end
end
for _, tid in ipairs(late) do table.insert(seen, tid) end
if #seen > 0 then redis.call('SADD', p .. 'seen', unpack(seen)) end
if #payloads > 0 then redis.call('MSET', unpack(payloads)) end
for _, gid in ipairs(order) do
  local g, gk = groups[gid], p .. 'g:' .. gid
  if g.new then
    local seq = redis.call('INCR', p .. 'seq')
    redis.call('HSET', gk, 'task', g.task, 'agent', g.agent, 'expected', g.size, 'seq', seq, 'minv', g.minv,
               'arrived', g.add, 'completed', g.completed)
    redis.call('ZADD', p .. 'pending', seq, gid)
    redis.call('ZADD', p .. 'pa:' .. g.agent, seq, gid)
  else
    redis.call('HSET', gk, 'minv', g.minv, 'arrived', g.arrived + g.add)
    redis.call('HINCRBY', gk, 'completed', g.completed)
  end
  redis.call('RPUSH', p .. 'm:' .. gid, unpack(g.members))
end
for key, value in pairs(count) do
  if value > 0 then redis.call('HINCRBY', p .. 'stats', key, value) end
end
for reason, value in pairs(reasons) do redis.call('HINCRBY', p .. 'reasons', reason, value) end
if #late > 0 then redis.call('HINCRBY', p .. 'stats', 'evicted', #late) end
return {'ok', #fresh, n - #fresh - #late}
"""

# ARGV: prefix, limit, table ('pending' for every agent's groups, 'pa:<agent>' for one agent's)
_PENDING = """#!lua flags=no-writes
local p = ARGV[1]
local limit = tonumber(ARGV[2])
local gids = redis.call('ZRANGE', p .. ARGV[3], 0, limit - 1)
local out = {redis.call('ZCARD', p .. ARGV[3])}
for _, gid in ipairs(gids) do
  local g = redis.call('HMGET', p .. 'g:' .. gid, 'task', 'expected', 'seq', 'minv', 'arrived', 'completed')
  -- one string per group: a reply element per field costs more to parse than to read
  table.insert(out, table.concat({gid, g[1], g[2], g[3], g[4], g[5], g[6]}, '\\31'))
end
return out
"""

# ARGV: prefix, mode ('evict' | 'retire'), group ids...
_DELETE = """#!lua flags=allow-oom
local p = ARGV[1]
local mode = ARGV[2]
local n = 0
for i = 3, #ARGV do
  local gid = ARGV[i]
  if redis.call('ZREM', p .. 'pending', gid) == 1 then
    redis.call('ZREM', p .. 'pa:' .. (redis.call('HGET', p .. 'g:' .. gid, 'agent') or ''), gid)
    local keys = {p .. 'g:' .. gid, p .. 'm:' .. gid}
    for _, m in ipairs(redis.call('LRANGE', p .. 'm:' .. gid, 0, -1)) do
      table.insert(keys, p .. 't:' .. string.sub(m, 3))
      n = n + 1
    end
    redis.call('DEL', unpack(keys))
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

# ARGV: prefix, batch id, deadline, pipeline state ('' to leave it), group ids...
_LEASE = """#!lua flags=allow-oom
local p = ARGV[1]
for i = 5, #ARGV do
  if not redis.call('ZSCORE', p .. 'pending', ARGV[i]) then return {'missing', ARGV[i]} end
end
if ARGV[4] ~= '' then redis.call('SET', p .. 'pipeline', ARGV[4]) end
local out = {'ok'}
local gids = {}
for i = 5, #ARGV do
  local gid = ARGV[i]
  redis.call('ZREM', p .. 'pending', gid)
  redis.call('ZREM', p .. 'pa:' .. (redis.call('HGET', p .. 'g:' .. gid, 'agent') or ''), gid)
  table.insert(gids, gid)
  local keys = {}
  for _, m in ipairs(redis.call('LRANGE', p .. 'm:' .. gid, 0, -1)) do
    if string.sub(m, 1, 1) == 'c' then table.insert(keys, p .. 't:' .. string.sub(m, 3)) end
  end
  if #keys > 0 then
    for _, payload in ipairs(redis.call('MGET', unpack(keys))) do table.insert(out, payload) end
  end
end
redis.call('SET', p .. 'lease:' .. ARGV[2], table.concat(gids, '\\n'))
redis.call('ZADD', p .. 'leases', ARGV[3], ARGV[2])
redis.call('HINCRBY', p .. 'stats', 'delivered', #out - 1)
return out
"""

# ARGV: prefix, batch id, pipeline state ('' to leave it)
_ACK = """#!lua flags=allow-oom
local p = ARGV[1]
local lk = p .. 'lease:' .. ARGV[2]
local groups = redis.call('GET', lk)
if not groups then return -1 end
if ARGV[3] ~= '' then redis.call('SET', p .. 'pipeline', ARGV[3]) end
local n = 0
for gid in string.gmatch(groups, '[^\\n]+') do
  n = n + tonumber(redis.call('HGET', p .. 'g:' .. gid, 'completed') or 0)
  local keys = {p .. 'g:' .. gid, p .. 'm:' .. gid}
  for _, m in ipairs(redis.call('LRANGE', p .. 'm:' .. gid, 0, -1)) do
    table.insert(keys, p .. 't:' .. string.sub(m, 3))
  end
  redis.call('DEL', unpack(keys))
end
redis.call('DEL', lk)
redis.call('ZREM', p .. 'leases', ARGV[2])
redis.call('HINCRBY', p .. 'stats', 'acked', n)
return n
"""

# ARGV: prefix, now, pipeline state ('' to leave it)
_REQUEUE = """#!lua flags=allow-oom
local p = ARGV[1]
if ARGV[3] ~= '' then redis.call('SET', p .. 'pipeline', ARGV[3]) end
local moved = 0
for _, bid in ipairs(redis.call('ZRANGEBYSCORE', p .. 'leases', '-inf', ARGV[2])) do
  local lk = p .. 'lease:' .. bid
  local groups = redis.call('GET', lk) or ''
  for gid in string.gmatch(groups, '[^\\n]+') do
    local g = redis.call('HMGET', p .. 'g:' .. gid, 'seq', 'completed', 'agent')
    redis.call('ZADD', p .. 'pending', g[1], gid)
    redis.call('ZADD', p .. 'pa:' .. (g[3] or ''), g[1], gid)
    redis.call('HINCRBY', p .. 'stats', 'redelivered', g[2])
    moved = moved + 1
  end
  redis.call('DEL', lk)
  redis.call('ZREM', p .. 'leases', bid)
end
return moved
"""

_COUNT_STORED = """#!lua flags=no-writes
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


_ACQUIRE = """#!lua flags=allow-oom
return redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) and 1 or 0
"""


class _DrainLock(redis.asyncio.lock.Lock):
    """redis-py's lock, taken by a script allowed to run when Redis is full (its SET is not): forming
    a batch is how a full buffer drains. Releasing (GET, DEL) needs no memory."""

    async def do_acquire(self, token: str | bytes) -> bool:
        px = int((self.timeout or 30.0) * 1000)
        return bool(await self.redis.eval(_ACQUIRE, 1, self.name, token, px))


P = ParamSpec("P")
T = TypeVar("T")


def _unreachable(exc: Exception) -> errors.Unavailable:
    return errors.Unavailable(f"Redis unreachable ({exc}); nothing was stored or changed")


def _refusing(fn: Callable[P, Coroutine[Any, Any, T]]) -> Callable[P, Coroutine[Any, Any, T]]:
    """``fn`` with Redis's own failures turned into the refusals a caller can act on."""

    @functools.wraps(fn)
    async def call(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return await fn(*args, **kwargs)
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
            raise _unreachable(exc) from exc
        except redis.exceptions.OutOfMemoryError as exc:
            raise errors.Overloaded(f"Redis is full and refuses writes ({exc}); nothing was stored") from exc

    return call


class RedisStore:
    """A buffer store in Redis; ``namespace`` separates jobs sharing one Redis."""

    def __init__(
        self, client: aioredis.Redis, *, namespace: str = "default", lock_timeout_s: float = 30.0
    ) -> None:
        self._r = client
        self._p = f"treadle:buf:{{{namespace}}}:"
        self._slot = [self._p + "seq"]
        """The key each script declares: routes it to the hash tag's node in a cluster."""
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

    @_refusing
    async def put(self, records: Sequence[protocol.Record]) -> protocol.PutResult:
        args: list[Any] = [self._p, len(records)]
        for r in records:
            fields = (r.trajectory_id, r.group_id, r.task, str(r.group_size), str(r.init_version), r.status)
            args += ["\x1f".join((*fields, r.agent, r.reason)), r.payload]
        reply = await self._put(keys=self._slot, args=args)
        if reply[0] == b"conflict":
            i = int(reply[1])
            raise store.member_error(
                i, records[i], task=reply[2].decode(), agent=reply[5].decode(), expected=int(reply[3]),
                arrived=int(reply[4]),
            )  # fmt: skip
        return protocol.PutResult(stored=int(reply[1]), duplicates=int(reply[2]))

    @contextlib.asynccontextmanager
    async def _locked(self) -> AsyncIterator[None]:
        try:
            lock = self._r.lock(
                self._p + "lock", timeout=self._lock_timeout_s, blocking_timeout=None, lock_class=_DrainLock
            )
            async with lock:
                yield
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
            raise _unreachable(exc) from exc

    def lock(self) -> contextlib.AbstractAsyncContextManager[None]:
        return self._locked()

    @_refusing
    async def pending(self, limit: int, *, agent: str | None = None) -> tuple[list[batching.Group], bool]:
        reply = await self._pending(
            keys=self._slot, args=[self._p, limit, "pending" if agent is None else f"pa:{agent}"]
        )
        total = int(reply[0])
        out = []
        for packed in reply[1:]:
            gid, task, expected, seq, minv, arrived, completed = packed.decode().split("\x1f")
            out.append(
                batching.Group(
                    group_id=gid,
                    task=task,
                    expected=int(expected),
                    seq=int(seq),
                    min_version=int(minv),
                    arrived=int(arrived),
                    completed=int(completed),
                )
            )
        return out, total > len(out)

    @_refusing
    async def evict(self, group_ids: Sequence[str]) -> int:
        return (
            int(await self._delete(keys=self._slot, args=[self._p, "evict", *group_ids])) if group_ids else 0
        )

    @_refusing
    async def retire(self, group_ids: Sequence[str]) -> int:
        return (
            int(await self._delete(keys=self._slot, args=[self._p, "retire", *group_ids])) if group_ids else 0
        )

    @_refusing
    async def lease(
        self, group_ids: Sequence[str], *, batch_id: str, deadline: float, pipeline: str | None = None
    ) -> store.Leased:
        reply = await self._lease(
            keys=self._slot, args=[self._p, batch_id, repr(deadline), pipeline or "", *group_ids]
        )
        if reply[0] == b"missing":
            raise NotFound(f"group {reply[1].decode()!r} is not pending")
        return store.Leased(payloads=list(reply[1:]))

    @_refusing
    async def ack(self, batch_id: str, *, pipeline: str | None = None) -> int:
        n = int(await self._ack(keys=self._slot, args=[self._p, batch_id, pipeline or ""]))
        if n < 0:
            raise NotFound(
                f"batch {batch_id!r} is not leased (unknown, already acked, or expired and redelivered)"
            )
        return n

    @_refusing
    async def requeue_expired(self, now: float, *, pipeline: str | None = None) -> int:
        return int(await self._requeue(keys=self._slot, args=[self._p, repr(now), pipeline or ""]))

    @_refusing
    async def pipeline_state(self) -> str | None:
        state = await self._r.get(self._p + "pipeline")
        return state.decode() if isinstance(state, bytes) else state

    @_refusing
    async def save_pipeline(self, state: str) -> None:
        await self._r.set(self._p + "pipeline", state)

    @_refusing
    async def counters(self) -> store.Counters:
        async with self._r.pipeline(transaction=False) as pipe:
            pipe.hgetall(self._p + "stats")
            pipe.hgetall(self._p + "reasons")
            stats, reasons = await pipe.execute()
        stored, groups, leases = await self._count(keys=self._slot, args=[self._p])
        c = store.Counters(stored=int(stored), stored_groups=int(groups), leased_batches=int(leases))
        for key, value in stats.items():
            setattr(c, key.decode(), int(value))
        c.failed_by_reason = {k.decode(): int(v) for k, v in reasons.items()}
        return c

    async def aclose(self) -> None:
        await self._r.aclose()
