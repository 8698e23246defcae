"""Per-tenant limits: calls and appended bytes per second, bytes stored.

No tenant can take a whole replica, or the whole service: each call is
counted against its tenant's rate before its request is decoded
(api/interceptors.py), and each append against the tenant's bytes per
second and its stored bytes before the items are hashed and counted
(sessions.py). Over a rate, the call is RESOURCE_EXHAUSTED (RATE_LIMITED)
with the delay after which it fits; a batch larger than a whole second's
bytes, or an append past the stored quota, is QUOTA_EXCEEDED (waiting does
not help).

Rates are sliding windows of one second from the `limits` library, kept in
Redis when the service has one, so they hold across replicas. When Redis does
not answer, each replica counts on its own for a few seconds and tries Redis
again (a tenant may then get up to the replica count times its rate: a brief
excess, never a refused call for Redis' sake). Stored bytes are the sum of
the tenant's sessions' own counts in the database, read at most once per
`STORED_REFRESH_SECONDS` per replica and added to by this replica's appends
meanwhile, so the quota can be passed by what other replicas append within
that time.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from limits import RateLimitItem, RateLimitItemPerSecond
from limits.aio.storage import MemoryStorage
from limits.aio.strategies import SlidingWindowCounterRateLimiter
from limits.errors import StorageError
from limits.storage import storage_from_string

from contextd.config import TenantLimits
from contextd.engine.errors import QuotaExceeded, RateLimited

if TYPE_CHECKING:
    from redis.asyncio import ConnectionPool

log = logging.getLogger("contextd.admission")

KEY_PREFIX = "contextd:limits"
REST_SECONDS = 5.0
"""After Redis fails to answer, how long each replica counts on its own before asking it again."""
STORED_REFRESH_SECONDS = 2.0
_LEAST_RETRY_MS = 20


class Admission:
    def __init__(
        self,
        limits: TenantLimits,
        redis_url: str = "",
        stored_bytes: Callable[[str], Awaitable[int]] | None = None,
        clock: Callable[[], float] = time.monotonic,
        *,
        redis_cluster: bool = False,
    ) -> None:
        """`stored_bytes(tenant)` reads what the tenant's sessions hold now (the database's count);
        with `redis_cluster`, `redis_url` names a node of a Redis Cluster."""
        self.limits = limits
        self._clock = clock
        self._local = SlidingWindowCounterRateLimiter(MemoryStorage())
        self._pool: ConnectionPool | None = None
        self._cluster: Any = None
        self._shared: SlidingWindowCounterRateLimiter | None = None
        if redis_url and limits.any and redis_cluster:
            storage = storage_from_string(
                _limits_uri(redis_url, cluster=True),
                implementation="redispy",
                key_prefix=KEY_PREFIX,
                wrap_exceptions=True,
                socket_connect_timeout=1,
                socket_timeout=1,
            )
            # `limits` builds the cluster client itself and offers no way to close it: its bridge
            # holds it (limits 5), and closing the service closes it through there.
            self._cluster = getattr(getattr(storage, "bridge", None), "storage", None)
            self._shared = SlidingWindowCounterRateLimiter(storage)
        elif redis_url and limits.any:
            # Our own pool, handed to `limits`, so that closing the service closes it.
            from redis.asyncio import ConnectionPool  # 0.1 s of CPU to import: only with Redis

            self._pool = ConnectionPool.from_url(redis_url, socket_connect_timeout=1, socket_timeout=1)
            storage = storage_from_string(
                _limits_uri(redis_url),
                implementation="redispy",
                key_prefix=KEY_PREFIX,
                wrap_exceptions=True,
                connection_pool=self._pool,  # type: ignore[arg-type]  # passed on to redis-py
            )
            self._shared = SlidingWindowCounterRateLimiter(storage)
        self._resting_until = 0.0
        self._stored_bytes = stored_bytes
        self._stored: dict[str, tuple[float, int]] = {}
        """tenant -> (when read, bytes): the database's count, plus this replica's appends since."""

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.aclose()
        if self._cluster is not None:
            await self._cluster.aclose()

    async def admit_call(self, tenant: str) -> None:
        """RateLimited when the tenant is over its calls per second."""
        limit = self.limits.of(tenant).requests_per_second
        if limit:
            await self._hit(tenant, "calls", RateLimitItemPerSecond(limit), 1)

    async def admit_append(self, tenant: str, size: int) -> None:
        """Count an append of `size` bytes against the tenant's rate and quota."""
        limits = self.limits.of(tenant)
        if limits.append_bytes_per_second:
            if size > limits.append_bytes_per_second:
                raise QuotaExceeded(
                    f"an append of {size:,} bytes is over tenant {tenant!r}'s {limits.append_bytes_per_second:,} "
                    "bytes per second: send smaller batches",
                    limits.append_bytes_per_second,
                )
            await self._hit(tenant, "bytes appended", RateLimitItemPerSecond(limits.append_bytes_per_second), size)
        if limits.stored_bytes and self._stored_bytes is not None:
            stored = await self._stored_now(tenant)
            if stored + size > limits.stored_bytes:
                raise QuotaExceeded(
                    f"tenant {tenant!r} stores {stored:,} bytes of items; {size:,} more would pass its quota of "
                    f"{limits.stored_bytes:,} bytes (deleting sessions frees theirs)",
                    limits.stored_bytes,
                )

    def appended(self, tenant: str, size: int) -> None:
        """An append of `size` bytes by `tenant` committed (counted until the next read)."""
        held = self._stored.get(tenant)
        if held is not None:
            self._stored[tenant] = (held[0], held[1] + size)

    def forget(self, tenant: str) -> None:
        """The tenant's stored bytes changed in a way this replica cannot add up (a deletion)."""
        self._stored.pop(tenant, None)

    async def _stored_now(self, tenant: str) -> int:
        held = self._stored.get(tenant)
        now = self._clock()
        if held is None or now - held[0] >= STORED_REFRESH_SECONDS:
            assert self._stored_bytes is not None
            held = (now, await self._stored_bytes(tenant))
            self._stored[tenant] = held
        return held[1]

    async def _hit(self, tenant: str, what: str, item: RateLimitItem, cost: int) -> None:
        limiter = self._limiter()
        try:
            admitted = await limiter.hit(item, tenant, what, cost=cost)
            if not admitted:
                reset = (await limiter.get_window_stats(item, tenant, what)).reset_time
        except StorageError as exc:
            self._rest(exc)
            limiter = self._local
            admitted = await limiter.hit(item, tenant, what, cost=cost)
            if not admitted:
                reset = (await limiter.get_window_stats(item, tenant, what)).reset_time
        if not admitted:
            wait_ms = min(1000, max(_LEAST_RETRY_MS, int((reset - time.time()) * 1000)))
            raise RateLimited(tenant, what, item.amount, wait_ms)

    def _limiter(self) -> SlidingWindowCounterRateLimiter:
        if self._shared is None or self._clock() < self._resting_until:
            return self._local
        return self._shared

    def _rest(self, exc: BaseException) -> None:
        if self._clock() >= self._resting_until:
            log.warning("rate limits counted per replica for %.0f s: Redis did not answer (%s)", REST_SECONDS, exc)
        self._resting_until = self._clock() + REST_SECONDS


def _limits_uri(redis_url: str, cluster: bool = False) -> str:
    """The `limits` library's name for a Redis URL (``unix://`` is its ``redis+unix://``; a
    cluster's node is ``redis+cluster://`` without a database number)."""
    scheme, _, rest = redis_url.partition("://")
    if cluster:
        return f"async+redis+cluster://{rest.split('/')[0]}"
    return f"async+{'redis+unix' if scheme == 'unix' else scheme}://{rest}"
