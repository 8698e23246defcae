"""Lists as long as the view, handed out without copying them whole.

A render resumes the previous render's lists (the view's items, its segments, its
messages' JSON, the entries repaired): it cuts each back to where the view changed and
appends what follows, in place. What it hands out (the view, the state's record of the
render, the lists the next render compares) must not change with them, so each was a
tuple or list of its own, copied whole at every render: about 40 µs a copy at 10,000
items (touching each element's reference count), and as many again when it is freed,
five of them a render.

`Blocked` keeps a list's elements as tuples of `BLOCK` and `Blocks` is a sequence
made of them: handing the list out as `Blocks` copies the elements of the last, partial
block and of the blocks a cut reached since the last time, and shares the others (the
same tuple objects). A `Blocks` never changes; two of one list compare block by block,
by identity first (`shared`).

Whoever cuts the list or replaces an element of it in place tells its `Blocked` (`cut`,
which cuts it; `changed`): a block it is not told of stays as it was, stale. Appending
needs no word (the last, partial block is made from the list at every hand-out).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import chain
from typing import Any, TypeVar, overload

T = TypeVar("T")

BLOCK = 256
"""Elements a block holds. The service encodes a view's items and messages by these blocks and
remembers each block's bytes (api/responses.py): a render resumes the previous one's, the same
objects at the same places but for the last and the few an edit changed, so most blocks come
back whole. Looking each item up (a memo's get, about a microsecond) cost 10 ms of a
10,000-item view's 13 (the interpreter lock held in small steps all the while)."""


class Blocks(Sequence[T]):
    """A sequence held as tuples of `BLOCK` elements (the last one may hold fewer)."""

    __slots__ = ("blocks", "n")

    def __init__(self, blocks: tuple[tuple[T, ...], ...] = ()) -> None:
        self.blocks = blocks
        self.n = (len(blocks) - 1) * BLOCK + len(blocks[-1]) if blocks else 0

    @classmethod
    def of(cls, elements: Sequence[T]) -> Blocks[T]:
        """`elements` as blocks (a copy)."""
        return cls(tuple(tuple(elements[k : k + BLOCK]) for k in range(0, len(elements), BLOCK)))

    def __len__(self) -> int:
        return self.n

    def replaced(self, index: int, value: T) -> Blocks[T]:
        """These elements with the one at `index` replaced by `value` (the other blocks shared)."""
        if index < 0:
            index += self.n
        if not 0 <= index < self.n:
            raise IndexError("blocks index out of range")
        at, offset = divmod(index, BLOCK)
        block = self.blocks[at]
        changed = (*block[:offset], value, *block[offset + 1 :])
        return Blocks((*self.blocks[:at], changed, *self.blocks[at + 1 :]))

    @overload
    def __getitem__(self, index: int) -> T: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[T, ...]: ...

    def __getitem__(self, index: int | slice) -> T | tuple[T, ...]:
        if isinstance(index, slice):  # (a tuple, as slicing a tuple gives; a whole block is that block)
            start, stop, step = index.indices(self.n)
            if step != 1:
                return tuple(self)[index]
            if stop <= start:
                return ()
            first, last = divmod(start, BLOCK), divmod(stop - 1, BLOCK)
            if first[0] == last[0]:
                block = self.blocks[first[0]]
                return block if first[1] == 0 and last[1] == len(block) - 1 else block[first[1] : last[1] + 1]
            pieces = self.blocks[first[0] : last[0] + 1]
            return (*pieces[0][first[1] :], *chain.from_iterable(pieces[1:-1]), *pieces[-1][: last[1] + 1])
        if index < 0:
            index += self.n
        if not 0 <= index < self.n:
            raise IndexError("blocks index out of range")
        return self.blocks[index // BLOCK][index % BLOCK]

    def extended(self, more: Sequence[T]) -> Blocks[T]:
        """These elements, then `more` (the whole blocks shared)."""
        if not more:
            return self
        whole = self.blocks if not self.blocks or len(self.blocks[-1]) == BLOCK else self.blocks[:-1]
        rest = (*self.blocks[len(whole) :][0], *more) if len(whole) < len(self.blocks) else tuple(more)
        return Blocks((*whole, *(rest[k : k + BLOCK] for k in range(0, len(rest), BLOCK))))

    def __iter__(self) -> Iterator[T]:
        return chain.from_iterable(self.blocks)

    def __reversed__(self) -> Iterator[T]:
        return chain.from_iterable(map(reversed, reversed(self.blocks)))

    def __eq__(self, other: object) -> bool:
        """Equal to a sequence of the same elements (not a string), as a tuple is to a tuple."""
        if isinstance(other, Blocks):
            return self.n == other.n and self.blocks == other.blocks  # (identity first, block by block)
        if isinstance(other, Sequence) and not isinstance(other, str | bytes):
            return self.n == len(other) and tuple(self) == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return f"Blocks({list(self)!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return Blocks, (self.blocks,)


def shared(previous: Sequence[Any], current: Sequence[Any], known: int = 0) -> int | None:
    """How many leading elements two `Blocks` share, as `memo.shared_prefix` counts them (equal
    elements): block by block, the blocks both hold as the same objects passed over, and
    within the first that differs element by element (from the block holding element `known`
    on: the caller knows those before it are shared); None when either is not `Blocks`."""
    if type(previous) is not Blocks or type(current) is not Blocks:
        return None
    skipped = min(known, previous.n, current.n) // BLOCK  # (whole blocks, both sides)
    same = skipped * BLOCK
    for a, b in zip(previous.blocks[skipped:], current.blocks[skipped:], strict=False):
        if a is not b and a != b:  # (a tuple's equality tests each pair for identity first)
            return same + _first_difference(a, b)
        same += min(len(a), len(b))
        if len(a) != len(b):
            break
    return same


def _first_difference(a: tuple[Any, ...], b: tuple[Any, ...]) -> int:
    """Where two blocks that differ first differ: halves compared at C speed, then a few
    elements one by one."""
    lo, hi = 0, min(len(a), len(b))
    while hi - lo > 8:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return next((i for i in range(lo, hi) if a[i] != b[i]), hi)


class Blocked:
    """The blocks of one list its owner appends to, replaces elements of in place (telling
    `changed`) and cuts back (through `cut`), kept from one hand-out (`blocks`) to the next."""

    __slots__ = ("clean", "dirty", "full")

    def __init__(self) -> None:
        self.full: list[tuple[Any, ...]] = []
        """The list's whole blocks as last handed out."""
        self.clean = 0
        """How many of `full` a cut left alone (those after it are made again)."""
        self.dirty: set[int] = set()
        """Blocks of `full` an element of which was replaced in place since."""

    def cut(self, elements: list[Any], at: int) -> None:
        """`del elements[at:]`, the blocks it reaches let go."""
        self.clean = min(self.clean, at // BLOCK)
        del elements[at:]

    def changed(self, at: int) -> None:
        """The element at `at` was replaced in place."""
        self.dirty.add(at // BLOCK)

    def blocks(self, elements: list[T]) -> Blocks[T]:
        """`elements` as they are now, as `Blocks`: the whole blocks still as they were shared,
        those a change reached and those appended since made, and the last, partial one."""
        whole = len(elements) // BLOCK
        full = self.full
        del full[min(self.clean, whole) :]
        for k in self.dirty:
            if k < len(full):
                full[k] = tuple(elements[k * BLOCK : (k + 1) * BLOCK])
        self.dirty.clear()
        full.extend(tuple(elements[k * BLOCK : (k + 1) * BLOCK]) for k in range(len(full), whole))
        self.clean = whole
        rest = tuple(elements[whole * BLOCK :])
        return Blocks((*full, rest) if rest else tuple(full))
