"""Remembering pure results per object, across renders.

Items never change, and the representations edits give them are kept from
render to render, so what is derived from them (a handle, a rendered
message, searchable text) can be computed once. The memo is keyed by the
identity of the objects it was computed from and holds them, so an id is
never reused while its result is remembered.

Renders run on worker threads (view_service.py), several at once: a memo
is read without a lock (one dict lookup, atomic under the GIL) and written
under one, so an eviction never races another.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from operator import is_
from typing import Generic, TypeVar

V = TypeVar("V")


class IdentityMemo(Generic[V]):
    """Bounded by count; when full, the oldest result goes first (a result still in
    use is computed again and comes back: slower, never wrong). Cheaper on the hot
    path than keeping the least recently used order."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._held: dict[object, tuple[tuple[object, ...], V]] = {}
        self._writing = threading.Lock()

    def get(self, sources: tuple[object, ...], compute: Callable[[], V]) -> V:
        """`compute()`, remembered for exactly these objects."""
        # On the hot path of every render, many times per item: C-level calls only.
        key: object = id(sources[0]) if len(sources) == 1 else tuple(map(id, sources))
        found = self._held.get(key)
        if found is not None and all(map(is_, found[0], sources)):
            return found[1]
        value = compute()
        with self._writing:
            held = self._held
            if key not in held and len(held) >= self.size:
                del held[next(iter(held))]
            held[key] = (sources, value)
        return value
