"""Remembering pure results per object, across renders.

Items never change, and the representations edits give them are kept from
render to render, so what is derived from them (a handle, a rendered
message, searchable text) can be computed once. The memo is keyed by the
identity of the objects it was computed from and holds them, so an id is
never reused while its result is remembered.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from operator import is_
from typing import Generic, TypeVar

V = TypeVar("V")


class IdentityMemo(Generic[V]):
    def __init__(self, size: int) -> None:
        self.size = size
        self._held: OrderedDict[tuple[int, ...], tuple[tuple[object, ...], V]] = OrderedDict()

    def get(self, sources: tuple[object, ...], compute: Callable[[], V]) -> V:
        """`compute()`, remembered for exactly these objects."""
        # On the hot path of every render: C-level map, no generators.
        key = tuple(map(id, sources))
        found = self._held.get(key)
        if found is not None and all(map(is_, found[0], sources)):
            self._held.move_to_end(key)
            return found[1]
        value = compute()
        self._held[key] = (sources, value)
        if len(self._held) > self.size:
            self._held.popitem(last=False)
        return value
