"""The stash: originals that left a view, kept close for a while (DESIGN section 7).

Every original a render takes out of a view (pruned, compressed, summarized)
is put here under its handle, scoped to its tenant and session, with a TTL
and a per-session byte bound (the least recently used entries go first).
It is a cache in front of the durable record, never the only copy: a miss
(expired, evicted, Redis flushed or down) is answered from the history and
the stash is warmed again. Two providers: Redis (`redis_stash.py`, for
replicas) and an in-process one (`memory.py`, the embedded default).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Protocol

DEFAULT_TTL_SECONDS = 3600.0
DEFAULT_SESSION_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Stashed:
    seq: int
    text: str


@dataclass(frozen=True, slots=True)
class StashEntry:
    handle: str
    bytes: int
    last_used: float
    """Seconds since the epoch."""


@dataclass(slots=True)
class StashStats:
    hits: int = 0
    misses: int = 0
    writes: int = 0
    skipped: int = 0
    """Writes and reads that failed (the store unreachable): counted, never raised."""
    evicted: int = 0

    @property
    def hit_rate(self) -> float:
        asked = self.hits + self.misses
        return self.hits / asked if asked else 0.0


def scope_of(tenant: str, session_key: int) -> str:
    """The stash's name for a session: a digest of its tenant and its key (never handed out
    again), so no id reaches into another's entries, nor a new session of a deleted one's name."""
    return hashlib.sha256(f"{tenant}\0{session_key}".encode()).hexdigest()[:32]


class Stash(Protocol):
    stats: StashStats
    ttl_seconds: float

    async def put(self, scope: str, handle: str, stashed: Stashed) -> None:
        """Keep `stashed` under `handle` for the TTL; never raises (a failure is counted)."""
        ...

    async def get(self, scope: str, handle: str) -> Stashed | None:
        """The entry, its TTL renewed; None when absent or unreachable."""
        ...

    async def touch(self, scope: str, handle: str) -> bool:
        """Renew the entry's TTL; whether it was there."""
        ...

    async def delete(self, scope: str, handle: str | None = None) -> None:
        """Drop one entry, or (no handle) the whole session's."""
        ...

    async def manifest(self, scope: str) -> list[StashEntry]:
        """The session's entries, least recently used first."""
        ...

    async def close(self) -> None: ...


def encode(stashed: Stashed) -> bytes:
    return f"{stashed.seq}\n".encode() + stashed.text.encode()


def decode(data: bytes) -> Stashed:
    seq, _, text = data.partition(b"\n")
    return Stashed(int(seq), text.decode())
