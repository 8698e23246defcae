"""The first elements of a list that is only ever appended to, held without copying it.

A session's history grows by appends and its items never change, so the list a
process keeps of it (storage's item cache) is only ever extended. A render is given
the history as of the session's version, and what the render leaves for the next
one (its carry) holds that same history: with a copy of its own, each was a list as
long as the session, made and compared at every render (about 40 µs a copy at
10,000 items, most of it touching each item's reference count). A `Prefix` of the
one list instead is made in constant time, stays as it was while the list grows,
and two prefixes of one list share the shorter of them without a compare.

What makes it safe is the list's owner's promise: it only appends (`extend`,
`append`), never replaces, removes or reorders an element. Nothing here can check
that: storage's item cache makes them (`contextd_storage.history`), and
bench/scale.py as the cache does.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import islice
from typing import Any, TypeVar, overload

T = TypeVar("T")


class Prefix(Sequence[T]):
    """`base[:n]`, read from `base`: a sequence that does not change while `base` is
    appended to."""

    __slots__ = ("base", "n")

    def __init__(self, base: list[T], n: int) -> None:
        if not 0 <= n <= len(base):
            raise ValueError(f"a prefix of {n} elements of a list of {len(base)}")
        self.base = base
        self.n = n

    def __len__(self) -> int:
        return self.n

    @overload
    def __getitem__(self, index: int) -> T: ...

    @overload
    def __getitem__(self, index: slice) -> list[T]: ...

    def __getitem__(self, index: int | slice) -> T | list[T]:
        if isinstance(index, slice):  # (a list, as slicing a list gives)
            start, stop, step = index.indices(self.n)
            if step < 0:  # (its bounds, resolved, may be -1: "before the first")
                return self.base[: self.n][index]
            return self.base[start:stop:step]
        if index < 0:
            index += self.n
        if not 0 <= index < self.n:
            raise IndexError("prefix index out of range")
        return self.base[index]

    def __iter__(self) -> Iterator[T]:
        return islice(self.base, self.n)

    def __reversed__(self) -> Iterator[T]:
        return reversed(self.base[: self.n])

    def __eq__(self, other: object) -> bool:
        """Equal to a sequence of the same elements (not a string; two prefixes of one list: by
        their lengths alone)."""
        if isinstance(other, Prefix):
            if other.base is self.base:
                return other.n == self.n
            return self.base[: self.n] == other.base[: other.n]
        if isinstance(other, Sequence) and not isinstance(other, str | bytes):
            return len(other) == self.n and self.base[: self.n] == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # (as a list's: its elements decide equality)

    def __repr__(self) -> str:
        return f"Prefix({self.n} of {len(self.base)})"

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as its own elements (what a pickle holds of the list's later ones is no
        part of it)."""
        held = self.base[: self.n]
        return Prefix, (held, len(held))


def common(a: Sequence[Any], b: Sequence[Any]) -> int | None:
    """How many leading elements `a` and `b` share when both are prefixes of one list (the
    shorter's length, known without comparing them); None when they are not."""
    if type(a) is Prefix and type(b) is Prefix and a.base is b.base:
        return min(a.n, b.n)
    return None


def held(items: Sequence[T], n: int | None = None) -> Sequence[T]:
    """The first `n` (all, when None) of `items`, as a sequence that stays as it is: a prefix of
    the same list when `items` is one (no copy), else a list of its own."""
    count = len(items) if n is None else min(n, len(items))
    if type(items) is Prefix:
        return Prefix(items.base, count)
    return list(items[:count]) if count < len(items) else list(items)
