"""Every Redis key the stash uses, built here and nowhere else.

All of a session's keys share one hash tag (``{scope}``), so they live in one
slot of a Redis Cluster and one script can touch them together.
"""

from __future__ import annotations

PREFIX = "contextd:stash"


def entry(scope: str, handle: str) -> str:
    """An original: ``seq\\ntext``, with the TTL."""
    return f"{PREFIX}:{{{scope}}}:e:{handle}"


def entry_prefix(scope: str) -> str:
    return f"{PREFIX}:{{{scope}}}:e:"


def recency(scope: str) -> str:
    """Sorted set: handle -> when it was last used (seconds since the epoch)."""
    return f"{PREFIX}:{{{scope}}}:lru"


def sizes(scope: str) -> str:
    """Hash: handle -> bytes of its entry."""
    return f"{PREFIX}:{{{scope}}}:size"


def total(scope: str) -> str:
    """Integer: the bytes of all the session's entries (kept by the scripts as they change)."""
    return f"{PREFIX}:{{{scope}}}:total"
