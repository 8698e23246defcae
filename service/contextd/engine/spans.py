"""Which reads of one file may cover given lines, or be covered by them, found without
looking at every read.

An agent paging through a file (`sed -n k,k+40p`, k growing) reads it thousands of times,
and none of those reads covers another. Asking, for each read, "which later read shows
these lines again?" by looking at every later read costs the square of the reads. Here the
reads of a path are kept in seq order with, per block of them, the lowest and the highest
first line and last line any of them reads: a block whose reads all start after the lines
asked for, or all end before them, holds no read that covers them and is passed over
whole (and likewise for reads the lines cover). That is a necessary condition only: what
it yields is checked by the caller (`shell.covers` and the rest), so the answers are the
same as looking at every read.

The reads are only ever appended (in seq order). An index and the copy a later render
extends may share one `ReadSpans`: each knows how many of its reads it sees, and only
blocks whose reads it all sees are passed over by their bounds.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence

BLOCK = 32
"""Reads per block."""
SUPER = BLOCK * BLOCK
"""Reads per block of blocks."""
Span = tuple[tuple[int, int], ...]


class _Bounds:
    """Per whole block of `size` reads: the least and the most of their first and last lines
    (a block is summed up once it is whole; the reads after the last whole one are read one
    by one)."""

    __slots__ = ("high_max", "high_min", "low_max", "low_min", "size")

    def __init__(self, size: int) -> None:
        self.size = size
        self.low_min: list[int] = []
        self.low_max: list[int] = []
        self.high_min: list[int] = []
        self.high_max: list[int] = []

    def add(self, lows: list[int], highs: list[int]) -> None:
        """Sum up the last block when the reads just appended made it whole."""
        count = len(lows)
        if count % self.size:
            return
        block_lows, block_highs = lows[count - self.size :], highs[count - self.size :]
        self.low_min.append(min(block_lows))
        self.low_max.append(max(block_lows))
        self.high_min.append(min(block_highs))
        self.high_max.append(max(block_highs))

    def holding_out(self, covering: bool) -> tuple[Sequence[int], Sequence[int]]:
        """Per whole block, the bounds by which it holds no read that covers (`covering`) given
        lines, or lies within them (`ReadSpans._scan`)."""
        return (self.low_min, self.high_max) if covering else (self.low_max, self.high_min)


class ReadSpans:
    """The line spans read of one path, in seq order; append-only."""

    __slots__ = ("blocks", "highs", "lows", "seqs", "supers")

    def __init__(self) -> None:
        self.seqs: list[int] = []
        self.lows: list[int] = []
        """The first line each read reads."""
        self.highs: list[int] = []
        """The last line each read reads."""
        self.blocks: _Bounds | None = None
        """Made once there is a whole block: most paths are read a few times."""
        self.supers: _Bounds | None = None

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
        if at + 1 >= BLOCK:
            self.blocks = self.blocks or _Bounds(BLOCK)
            self.blocks.add(self.lows, self.highs)
        if at + 1 >= SUPER:
            self.supers = self.supers or _Bounds(SUPER)
            self.supers.add(self.lows, self.highs)

    def covering(self, count: int, after: int, until: int, span: Span) -> Iterator[int]:
        """Seqs in (`after`, `until`], in order, of the first `count` reads whose first line is
        at most the first of `span` and whose last line is at least its last: every read that
        covers `span`, and some that do not."""
        low, high = _bounds(span)
        return self._scan(count, bisect.bisect_right(self.seqs, after, 0, count), until, True, low, high)

    def covered_by(self, count: int, span: Span) -> Iterator[int]:
        """Seqs, in order, of the first `count` reads whose first line is at least the first of
        `span` and whose last line is at most its last: every read `span` covers, and some
        it does not."""
        low, high = _bounds(span)
        return self._scan(count, 0, NO_LINE, False, low, high)

    def _scan(self, count: int, i: int, until: int, covering: bool, low: int, high: int) -> Iterator[int]:
        # The bounds are tested here, not by a call a block (a scan tests a hundred blocks or
        # more), and the reads of a block not passed over by one comprehension, not read by read:
        # 1.9x faster on reads paging through a file, 2.5x on ranges anywhere in it (bench/spans.py).
        seqs, lows, highs = self.seqs, self.lows, self.highs
        end = bisect.bisect_right(seqs, until, i, count)
        # A whole block (of reads, of blocks) is passed over when its bounds hold it out: for a
        # scan for reads covering the lines, when none of its reads starts at or before the
        # first line or none ends at or after the last; for reads within them, the other way
        # round.
        s_low, s_high = self.supers.holding_out(covering) if self.supers is not None else ((), ())
        b_low, b_high = self.blocks.holding_out(covering) if self.blocks is not None else ((), ())
        whole_supers, whole_blocks = min(count // SUPER, len(s_low)), min(count // BLOCK, len(b_low))
        while i < end:
            k = i // SUPER
            if (
                not i % SUPER
                and k < whole_supers
                and ((s_low[k] > low or s_high[k] < high) if covering else (s_low[k] < low or s_high[k] > high))
            ):
                i += SUPER
                continue
            k = i // BLOCK
            if (
                not i % BLOCK
                and k < whole_blocks
                and ((b_low[k] > low or b_high[k] < high) if covering else (b_low[k] < low or b_high[k] > high))
            ):
                i += BLOCK
                continue
            stop = min(end, (k + 1) * BLOCK)
            read = zip(seqs[i:stop], lows[i:stop], highs[i:stop], strict=True)
            if covering:
                yield from [seq for seq, first, last in read if first <= low and last >= high]
            else:
                yield from [seq for seq, first, last in read if first >= low and last <= high]
            i = stop


def _bounds(span: Span) -> tuple[int, int]:
    """The first and the last line of `span`; of no lines, bounds any read passes the test with."""
    if not span:
        return NO_LINE, -1
    return min(first for first, _ in span), max(last for _, last in span)


NO_LINE = 2**63
"""Past every line."""
