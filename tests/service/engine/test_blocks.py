"""Lists handed out as blocks (service/contextd/engine/blocks.py)."""

from __future__ import annotations

import pickle
from itertools import pairwise

from hypothesis import given, settings
from hypothesis import strategies as st

from contextd.engine.blocks import BLOCK, Blocked, Blocks, shared
from contextd.engine.memo import shared_prefix
from contextd.engine.prefix import Prefix

# What an owner does to its list: append some, cut back to a point, replace one in place; and
# when it hands the list out (after some of those).
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(1, 3 * BLOCK)),
        st.tuples(st.just("cut"), st.floats(0, 1)),
        st.tuples(st.just("replace"), st.floats(0, 1)),
        st.tuples(st.just("hand out"), st.just(0.0)),
    ),
    max_size=16,
)


@settings(max_examples=300)
@given(OPS)
def test_what_is_handed_out_is_the_list_as_it_was_and_stays_so_whatever_the_owner_does_after(
    ops: list[tuple[str, float]],
) -> None:
    elements: list[object] = []
    blocked = Blocked()
    handed: list[tuple[Blocks[object], list[object]]] = []
    for op, arg in ops:
        if op == "append":
            elements.extend(object() for _ in range(int(arg)))
        elif op == "cut":
            blocked.cut(elements, int(arg * len(elements)))
        elif op == "replace" and elements:
            at = min(int(arg * len(elements)), len(elements) - 1)
            elements[at] = object()
            blocked.changed(at)
        if op != "hand out":
            continue
        out = blocked.blocks(elements)
        assert list(out) == elements and len(out) == len(elements)
        assert all(len(b) == BLOCK for b in out.blocks[:-1]) and (not out.blocks or 0 < len(out.blocks[-1]) <= BLOCK)
        handed.append((out, list(elements)))
    for out, was in handed:  # every one handed out, after all the owner did since
        assert list(out) == was and out == was and out == tuple(was)
    for (before, was), (after, now) in pairwise(handed):
        expected = next(
            (i for i, (a, b) in enumerate(zip(was, now, strict=False)) if a is not b), min(len(was), len(now))
        )
        for known in {0, expected // 3, expected}:  # (what the caller knows they share: from there on)
            assert shared_prefix(before, after, known) == expected
        by_blocks = shared(before, after)
        assert by_blocks is not None and by_blocks <= expected  # (the blocks shared: a lower bound)


@given(st.integers(0, 3 * BLOCK), st.data())
def test_blocks_read_as_the_tuple_of_their_elements(n: int, data: st.DataObject) -> None:
    elements = tuple(range(n))
    out = Blocks.of(elements)
    assert len(out) == n and tuple(out) == elements and tuple(reversed(out)) == elements[::-1]
    for _ in range(10):
        index = data.draw(st.integers(-n - 1, n))
        assert (out[index] == elements[index]) if -n <= index < n else _raises_index_error(out, index)
        start, stop = data.draw(st.integers(-n - 2, n + 2)), data.draw(st.integers(-n - 2, n + 2))
        step = data.draw(st.sampled_from([None, 1, 2, -1]))
        assert out[start:stop:step] == elements[start:stop:step]
    if n:
        at = data.draw(st.integers(-n, n - 1))
        replaced = out.replaced(at, -1)
        changed = list(elements)
        changed[at] = -1
        assert tuple(replaced) == tuple(changed) and tuple(out) == elements
        assert sum(a is not b for a, b in zip(out.blocks, replaced.blocks, strict=True)) == 1  # the others shared
    assert _raises_index_error_on_replace(out, n) and _raises_index_error_on_replace(out, -n - 1)
    more = tuple(range(-data.draw(st.integers(0, BLOCK + 3)), 0))
    longer = out.extended(more)
    assert tuple(longer) == elements + more and all(len(b) == BLOCK for b in longer.blocks[:-1])
    assert all(a is b for a, b in zip(out.blocks[: n // BLOCK], longer.blocks, strict=False))  # whole blocks shared
    assert out == list(elements) and out == Prefix(list(elements), n) and Prefix(list(elements), n) == out
    assert pickle.loads(pickle.dumps(out)) == out and hash(out) == hash(elements)
    if n >= BLOCK:
        assert out[:BLOCK] is out.blocks[0]  # a whole block is handed out as it is held


def _raises_index_error_on_replace(out: Blocks[int], index: int) -> bool:
    try:
        out.replaced(index, 0)
    except IndexError:
        return True
    return False


def _raises_index_error(out: Blocks[int], index: int) -> bool:
    try:
        out[index]
    except IndexError:
        return True
    return False
