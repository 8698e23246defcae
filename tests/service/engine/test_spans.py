"""The reads of a path that may cover given lines (service/contextd/engine/spans.py): what
`covering` yields is exactly the reads whose bounds take in the lines asked for, in order,
whatever the blocks skipped, and an index sharing its reads with a copy that went another
way still sees its own."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from contextd.engine.shell import WHOLE
from contextd.engine.spans import BLOCK, SUPER, ReadSpans, Span


def bounds(lines: Span) -> tuple[int, int]:
    return (min(a for a, _ in lines), max(b for _, b in lines)) if lines else (2**63, -1)


def expected(reads: list[tuple[int, Span]], after: int, until: int, span: Span) -> list[int]:
    low, high = bounds(span)
    return [seq for seq, read in reads if after < seq <= until and bounds(read)[0] <= low and bounds(read)[1] >= high]


def pages(seed: int, n: int) -> list[Span]:
    """An agent's reads of one file: mostly pages that move on as it reads, some read again,
    now and then the whole file, a few of several ranges or of none."""
    rng = random.Random(seed)
    out: list[Span] = []
    for k in range(n):
        kind = rng.random()
        first = max(1, k + rng.randint(-8, 8))
        if kind < 0.02:
            out.append(WHOLE)
        elif kind < 0.04:
            out.append(())
        elif kind < 0.08:
            out.append(((first, first + rng.randint(0, 20)), (first + 40, first + 40 + rng.randint(0, 20))))
        else:
            out.append(((first, first + rng.randint(0, 60)),))
    return out


@settings(max_examples=150, deadline=None)
@given(
    st.integers(0, 2**32),
    st.sampled_from([0, 5, BLOCK - 1, 3 * BLOCK + 7, SUPER + 3 * BLOCK, 2 * SUPER + 9]),
    st.data(),
)
def test_covering_yields_every_read_whose_bounds_take_in_the_lines(seed: int, n: int, data: st.DataObject) -> None:
    reads = [(2 * k + 1, s) for k, s in enumerate(pages(seed, n))]
    index = ReadSpans()
    for seq, read in reads:
        index.add(seq, read)
    count = data.draw(st.integers(0, n))
    after = data.draw(st.integers(0, 2 * count + 1))
    until = data.draw(st.integers(after, 2 * count + 2))
    if count and data.draw(st.booleans()):  # lines a read in range reads exactly: at the blocks' bounds
        span = reads[data.draw(st.integers(min(after // 2, count - 1), count - 1))][1]
    else:
        first = data.draw(st.integers(1, 2 * n + 2))
        span = data.draw(st.sampled_from([((first, first + data.draw(st.integers(0, 60))),), WHOLE, ()]))
    assert list(index.covering(count, after, until, span)) == expected(reads[:count], after, until, span)


def test_a_copy_that_went_another_way_leaves_the_reads_the_first_one_sees() -> None:
    shared = ReadSpans()
    for n in range(3 * BLOCK):
        shared.add(n + 1, ((n + 1, n + 40),))
    fork = shared.copy(BLOCK + 5)  # as an index that saw the first BLOCK + 5 reads, then its own
    fork.add(1000, ((1, 10**12),))
    assert list(fork.covering(len(fork), 0, 2000, ((5, 6),))) == [1, 2, 3, 4, 5, 1000]
    assert list(shared.covering(BLOCK + 5, 0, 2000, ((5, 6),))) == [1, 2, 3, 4, 5]


def test_the_lines_of_each_read_find_the_reads_that_take_them_in() -> None:
    reads = [(2 * k + 1, s) for k, s in enumerate(pages(7, 2 * SUPER + 9))]
    index = ReadSpans()
    for seq, read in reads:
        index.add(seq, read)
    for k in sorted({*range(0, len(reads), 7), *range(0, len(reads), BLOCK)}):  # each block's first read too
        seq, span = reads[k]
        for after in (0, seq - 1):
            assert list(index.covering(len(reads), after, 2**62, span)) == expected(reads, after, 2**62, span)


def covered(reads: list[tuple[int, Span]], span: Span) -> list[int]:
    low, high = bounds(span)
    return [seq for seq, read in reads if bounds(read)[0] >= low and bounds(read)[1] <= high]


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 2**32), st.sampled_from([0, 5, 3 * BLOCK + 7, SUPER + 3 * BLOCK, 2 * SUPER + 9]), st.data())
def test_covered_by_yields_every_read_whose_bounds_lie_within_the_lines(seed: int, n: int, data: st.DataObject) -> None:
    reads = [(2 * k + 1, s) for k, s in enumerate(pages(seed, n))]
    index = ReadSpans()
    for seq, read in reads:
        index.add(seq, read)
    count = data.draw(st.integers(0, n))
    if count and data.draw(st.booleans()):  # the lines of a read: at the blocks' bounds
        span = reads[data.draw(st.integers(0, count - 1))][1]
    else:
        first = data.draw(st.integers(1, 2 * n + 2))
        span = data.draw(st.sampled_from([((first, first + data.draw(st.integers(0, 90))),), WHOLE, ()]))
    assert list(index.covered_by(count, span)) == covered(reads[:count], span)


def test_the_lines_of_each_read_find_the_reads_they_take_in() -> None:
    reads = [(2 * k + 1, s) for k, s in enumerate(pages(11, 2 * SUPER + 9))]
    index = ReadSpans()
    for seq, read in reads:
        index.add(seq, read)
    for k in sorted({*range(0, len(reads), 7), *range(0, len(reads), BLOCK)}):
        assert list(index.covered_by(len(reads), reads[k][1])) == covered(reads, reads[k][1])
