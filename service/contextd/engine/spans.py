"""Which reads of one file may cover given lines, found without looking at every read.

An agent paging through a file (`sed -n k,k+40p`, k growing) reads it thousands of times,
and none of those reads covers another. Asking, for each read, "which later read shows
these lines again?" by looking at every later read costs the square of the reads. Here the
reads of a path are kept in seq order with, per block of them, the lowest first line and the
highest last line any of them reads: a block whose reads all start after the lines asked
for, or all end before them, holds no read that covers them and is passed over whole.
That is a necessary condition only: what it yields is checked by the caller
(`shell.covers` and the rest), so the answers are the same as looking at every read.

The reads are only ever appended (in seq order). An index and the copy a later render
extends may share one `ReadSpans`: each knows how many of its reads it sees, and a block's
bounds only widen as reads are added, which can make a block pass the test in vain, never
fail it wrongly.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator

BLOCK = 32
"""Reads per block."""
SUPER = BLOCK * BLOCK
"""Reads per block of blocks."""
Span = tuple[tuple[int, int], ...]


class ReadSpans:
    """The line spans read of one path, in seq order; append-only."""

    __slots__ = ("block_high", "block_low", "highs", "lows", "seqs", "super_high", "super_low")

    def __init__(self) -> None:
        self.seqs: list[int] = []
        self.lows: list[int] = []
        """The first line each read reads."""
        self.highs: list[int] = []
        """The last line each read reads."""
        self.block_low: list[int] = []
        self.block_high: list[int] = []
        self.super_low: list[int] = []
        self.super_high: list[int] = []

    def __len__(self) -> int:
        return len(self.seqs)

    def copy(self, count: int) -> ReadSpans:
        """A new one holding the first `count` reads."""
        other = ReadSpans()
        for seq, low, high in zip(self.seqs[:count], self.lows[:count], self.highs[:count], strict=True):
            other._append(seq, low, high)
        return other

    def add(self, seq: int, span: Span) -> None:
        self._append(seq, *_bounds(span))

    def _append(self, seq: int, low: int, high: int) -> None:
        at = len(self.seqs)
        self.seqs.append(seq)
        self.lows.append(low)
        self.highs.append(high)
        for lows, highs, size in ((self.block_low, self.block_high, BLOCK), (self.super_low, self.super_high, SUPER)):
            if at % size == 0:
                lows.append(low)
                highs.append(high)
            else:
                lows[-1] = min(lows[-1], low)
                highs[-1] = max(highs[-1], high)

    def covering(self, count: int, after: int, until: int, span: Span) -> Iterator[int]:
        """Seqs in (`after`, `until`], in order, of the first `count` reads whose first line is
        at most the first of `span` and whose last line is at least its last: every read that
        covers `span`, and some that do not."""
        low, high = _bounds(span)
        seqs, lows, highs = self.seqs, self.lows, self.highs
        i = bisect.bisect_right(seqs, after, 0, count)
        while i < count:
            if seqs[i] > until:
                return
            if i % SUPER == 0 and i + SUPER <= count:
                k = i // SUPER
                if self.super_low[k] > low or self.super_high[k] < high:
                    i += SUPER
                    continue
            if i % BLOCK == 0 and i + BLOCK <= count:
                k = i // BLOCK
                if self.block_low[k] > low or self.block_high[k] < high:
                    i += BLOCK
                    continue
            if lows[i] <= low and highs[i] >= high:
                yield seqs[i]
            i += 1


def _bounds(span: Span) -> tuple[int, int]:
    """The first and the last line of `span`; of no lines, bounds any read passes the test with."""
    if not span:
        return NO_LINE, -1
    return min(first for first, _ in span), max(last for _, last in span)


NO_LINE = 2**63
"""Past every line."""
