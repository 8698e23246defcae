"""The Redis stash: shared by replicas, a TTL on every key, a byte bound per session.

Memory guidance: give Redis a ``maxmemory`` that holds the sessions you
expect times their bound (``stash_session_bytes``, 64 MiB by default, most
sessions far less), with ``maxmemory-policy volatile-lru`` or
``allkeys-lru``: every stash key carries a TTL, and an entry Redis drops is
served from the durable record and stashed again, never lost.

Redis being down never fails a call: a write is skipped and a read misses
(both counted, `StashStats.skipped`), and the next call tries again, so the
stash is used again as soon as Redis answers, without a restart.
"""

from __future__ import annotations

import logging
import time

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from contextd_storage.stash import (
    DEFAULT_SESSION_BYTES,
    DEFAULT_TTL_SECONDS,
    Stashed,
    StashEntry,
    StashStats,
    decode,
    encode,
    keys,
)

log = logging.getLogger(__name__)

DELETE_BATCH = 500
REST_SECONDS = 1.0
"""After Redis fails to answer, how long the stash is skipped before it is tried again."""

# Put an entry, mark it used, bound the session: the least recently used entries
# (other than this one) go until the session's entries fit. The session's byte total
# is kept as it changes (not summed again at each put). Atomic in Redis.
# KEYS: entry, recency, sizes, total. ARGV: handle, value, ttl, now, bound, entry prefix.
_PUT = """
local size = string.len(ARGV[2])
local before = tonumber(redis.call('HGET', KEYS[3], ARGV[1]) or '0')
redis.call('SET', KEYS[1], ARGV[2], 'EX', ARGV[3])
redis.call('ZADD', KEYS[2], ARGV[4], ARGV[1])
redis.call('HSET', KEYS[3], ARGV[1], size)
local total = redis.call('INCRBY', KEYS[4], size - before)
for i = 2, 4 do redis.call('EXPIRE', KEYS[i], ARGV[3]) end
local evicted = 0
while total > tonumber(ARGV[5]) do
  local oldest = redis.call('ZRANGE', KEYS[2], 0, 0)[1]
  if oldest == nil or oldest == ARGV[1] then break end
  local gone = tonumber(redis.call('HGET', KEYS[3], oldest) or '0')
  redis.call('DEL', ARGV[6] .. oldest)
  redis.call('ZREM', KEYS[2], oldest)
  redis.call('HDEL', KEYS[3], oldest)
  total = redis.call('DECRBY', KEYS[4], gone)
  evicted = evicted + 1
end
return evicted
"""

# Drop one entry and its share of the session's total. KEYS: entry, recency, sizes, total.
# ARGV: handle.
_DROP = """
local gone = tonumber(redis.call('HGET', KEYS[3], ARGV[1]) or '0')
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
if gone > 0 then redis.call('DECRBY', KEYS[4], gone) end
return gone
"""

# Get an entry and renew it (its TTL, its place in the recency order, the session's
# other keys). KEYS: entry, recency, sizes, total. ARGV: handle, ttl, now.
_GET = """
local value = redis.call('GET', KEYS[1])
if not value then return false end
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[1])
for i = 1, 4 do redis.call('EXPIRE', KEYS[i], ARGV[2]) end
return value
"""


class RedisStash:
    def __init__(
        self,
        client: Redis | RedisCluster,
        ttl_seconds: float = DEFAULT_TTL_SECONDS,
        session_bytes: int = DEFAULT_SESSION_BYTES,
    ) -> None:
        self.client = client
        self.ttl_seconds = ttl_seconds
        self.session_bytes = session_bytes
        self.stats = StashStats()
        self._resting_until = 0.0
        """After a failure, calls are skipped until then (a down Redis costs no timeouts)."""
        self._put = client.register_script(_PUT)
        self._drop = client.register_script(_DROP)
        self._get = client.register_script(_GET)

    @classmethod
    def from_url(cls, url: str, ttl_seconds: float, session_bytes: int, *, cluster: bool = False) -> RedisStash:
        """The stash on the Redis at `url`; with `cluster`, on the Redis Cluster that node is
        part of (each script's keys are one session's, in one hash slot: keys.py)."""
        # One quick retry for a dropped connection; an outage is the rest's business, not retries'.
        client = redis_client(url, cluster, timeout=0.5, retry=Retry(NoBackoff(), 1))
        return cls(client, ttl_seconds, session_bytes)

    @property
    def _ttl(self) -> int:
        return max(1, round(self.ttl_seconds))

    def _resting(self) -> bool:
        if time.monotonic() < self._resting_until:
            self.stats.skipped += 1
            return True
        return False

    async def put(self, scope: str, handle: str, stashed: Stashed) -> None:
        if self._resting():
            return
        try:
            evicted = await self._put(
                keys=[keys.entry(scope, handle), keys.recency(scope), keys.sizes(scope), keys.total(scope)],
                args=[handle, encode(stashed), self._ttl, time.time(), self.session_bytes, keys.entry_prefix(scope)],
            )
        except (RedisError, OSError) as exc:
            self._skipped("put", exc)
            return
        self.stats.writes += 1
        self.stats.evicted += int(evicted)

    async def get(self, scope: str, handle: str) -> Stashed | None:
        if self._resting():
            self.stats.misses += 1
            return None
        try:
            value = await self._get(
                keys=[keys.entry(scope, handle), keys.recency(scope), keys.sizes(scope), keys.total(scope)],
                args=[handle, self._ttl, time.time()],
            )
        except (RedisError, OSError) as exc:
            self._skipped("get", exc)
            self.stats.misses += 1
            return None
        if value is None:
            self.stats.misses += 1
            return None
        self.stats.hits += 1
        return decode(value)

    async def touch(self, scope: str, handle: str) -> bool:
        return await self.get(scope, handle) is not None

    async def delete(self, scope: str, handle: str | None = None) -> None:
        if self._resting():
            return
        try:
            if handle is not None:
                session = [keys.entry(scope, handle), keys.recency(scope), keys.sizes(scope), keys.total(scope)]
                await self._drop(keys=session, args=[handle])
                return
            handles = [_text(h) for h in await self.client.hkeys(keys.sizes(scope))]
            for start in range(0, len(handles), DELETE_BATCH):  # not one command with every key
                await self.client.delete(*(keys.entry(scope, h) for h in handles[start : start + DELETE_BATCH]))
            await self.client.delete(keys.recency(scope), keys.sizes(scope), keys.total(scope))
        except (RedisError, OSError) as exc:
            self._skipped("delete", exc)

    async def manifest(self, scope: str) -> list[StashEntry]:
        if self._resting():
            return []
        try:
            async with self.client.pipeline(transaction=False) as pipe:
                pipe.zrange(keys.recency(scope), 0, -1, withscores=True)
                pipe.hgetall(keys.sizes(scope))
                used, sizes = await pipe.execute()
        except (RedisError, OSError) as exc:
            self._skipped("manifest", exc)
            return []
        return [
            StashEntry(_text(handle), int(sizes.get(handle, 0)), float(when))
            for handle, when in used
            if time.time() - float(when) < self.ttl_seconds
        ]

    async def close(self) -> None:
        await self.client.aclose()

    def _skipped(self, what: str, exc: BaseException) -> None:
        self.stats.skipped += 1
        if time.monotonic() >= self._resting_until:
            log.warning("stash %s skipped: Redis did not answer (%s); trying again in %.0f s", what, exc, REST_SECONDS)
        self._resting_until = time.monotonic() + REST_SECONDS


def redis_client(url: str, cluster: bool, timeout: float, retry: Retry | None = None) -> Redis | RedisCluster:
    """A client of the Redis at `url`, or (`cluster`) of the Redis Cluster that node is part of."""
    if cluster:
        return RedisCluster.from_url(url, socket_connect_timeout=timeout, socket_timeout=timeout, retry=retry)
    return Redis.from_url(url, socket_connect_timeout=timeout, socket_timeout=timeout, retry=retry)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
