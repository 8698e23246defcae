"""The in-process stash: TTL and least-recently-used eviction per session (embedded mode)."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

from contextd_storage.stash import (
    DEFAULT_SESSION_BYTES,
    DEFAULT_TTL_SECONDS,
    Stashed,
    StashEntry,
    StashStats,
    decode,
    encode,
)

TOTAL_BYTES = 512 * 1024 * 1024
"""All sessions together: past this, the least recently used session's oldest entries go."""


class MemoryStash:
    def __init__(
        self,
        ttl_seconds: float = DEFAULT_TTL_SECONDS,
        session_bytes: int = DEFAULT_SESSION_BYTES,
        total_bytes: int = TOTAL_BYTES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl_seconds = ttl_seconds
        self.session_bytes = session_bytes
        self.total_bytes = total_bytes
        self.stats = StashStats()
        self._clock = clock
        self._sessions: OrderedDict[str, OrderedDict[str, tuple[bytes, float]]] = OrderedDict()
        """scope -> handle -> (value, expires at), least recently used first at both levels."""
        self._bytes: dict[str, int] = {}
        self._total = 0

    async def put(self, scope: str, handle: str, stashed: Stashed) -> None:
        value = encode(stashed)
        entries = self._sessions.setdefault(scope, OrderedDict())
        self._sessions.move_to_end(scope)
        self._drop(scope, handle)
        entries[handle] = (value, self._clock() + self.ttl_seconds)
        self._bytes[scope] = self._bytes.get(scope, 0) + len(value)
        self._total += len(value)
        self.stats.writes += 1
        while self._bytes[scope] > self.session_bytes and len(entries) > 1:
            self._drop(scope, next(iter(entries)), evicted=True)
        while self._total > self.total_bytes and len(self._sessions) > 1:
            oldest = next(iter(self._sessions))
            self._drop(oldest, next(iter(self._sessions[oldest])), evicted=True)

    async def get(self, scope: str, handle: str) -> Stashed | None:
        entries = self._sessions.get(scope)
        found = entries.get(handle) if entries is not None else None
        if found is None or found[1] <= self._clock():
            if found is not None:
                self._drop(scope, handle)
            self.stats.misses += 1
            return None
        assert entries is not None
        entries[handle] = (found[0], self._clock() + self.ttl_seconds)
        entries.move_to_end(handle)
        self._sessions.move_to_end(scope)
        self.stats.hits += 1
        return decode(found[0])

    async def touch(self, scope: str, handle: str) -> bool:
        return await self.get(scope, handle) is not None

    async def delete(self, scope: str, handle: str | None = None) -> None:
        if handle is not None:
            self._drop(scope, handle)
            return
        for h in list(self._sessions.get(scope, ())):
            self._drop(scope, h)

    async def manifest(self, scope: str) -> list[StashEntry]:
        now = self._clock()
        return [
            StashEntry(handle, len(value), time.time() - (self.ttl_seconds - (expires - now)))
            for handle, (value, expires) in self._sessions.get(scope, {}).items()
            if expires > now
        ]

    async def close(self) -> None:
        self._sessions.clear()

    def _drop(self, scope: str, handle: str, *, evicted: bool = False) -> None:
        entries = self._sessions.get(scope)
        if entries is None or handle not in entries:
            return
        value, _ = entries.pop(handle)
        self._bytes[scope] -= len(value)
        self._total -= len(value)
        self.stats.evicted += evicted
        if not entries:
            del self._sessions[scope]
            del self._bytes[scope]
