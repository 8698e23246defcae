"""Results remembered per object (service/contextd/engine/memo.py)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from contextd.engine.memo import (
    DEFAULT_MEMO_BYTES,
    ENTRY_BYTES,
    SHARED_SCAN,
    IdentityMemo,
    clear_memos,
    memo_bytes,
    set_memo_bytes,
    shared_prefix,
    weigh,
)
from contextd.engine.model import ItemContent, Role


def test_a_result_is_remembered_for_the_same_objects_only() -> None:
    memo: IdentityMemo[str] = IdentityMemo(10)
    calls: list[str] = []

    def compute(value: str) -> str:
        calls.append(value)
        return value.upper()

    a, b = ["a"], ["a"]  # equal, not the same
    assert memo.get((a,), lambda: compute("a")) == "A"
    assert memo.get((a,), lambda: compute("x")) == "A"
    assert memo.get((b,), lambda: compute("b")) == "B"
    assert memo.get((a, b), lambda: compute("ab")) == "AB"
    assert memo.get((b, a), lambda: compute("ba")) == "BA"
    assert calls == ["a", "b", "ab", "ba"]


def test_the_memo_is_bounded_and_the_oldest_result_goes_first() -> None:
    memo: IdentityMemo[int] = IdentityMemo(2)
    held = [object() for _ in range(3)]
    for n, obj in enumerate(held):
        memo.get((obj,), lambda n=n: n)  # type: ignore[misc]
    assert memo.get((held[0],), lambda: -1) == -1  # evicted, computed again
    assert memo.get((held[2],), lambda: -1) == 2


def test_every_memo_together_holds_no_more_than_the_byte_budget_the_largest_giving_way() -> None:
    """Past the budget the largest memo gives up its oldest results until the memos hold 90% of
    it (so memos filling the budget are trimmed once in a while, not at every result)."""
    clear_memos()  # the engine's own: only this test's hold anything
    first: IdentityMemo[str] = IdentityMemo(1000)
    second: IdentityMemo[str] = IdentityMemo(1000)
    held = [object() for _ in range(40)]
    each = ENTRY_BYTES + weigh("x" * 1000)
    try:
        set_memo_bytes(20 * each)
        for n, obj in enumerate(held[:30], start=1):
            first.get((obj,), lambda: "x" * 1000)
            assert first.bytes == (n if n <= 20 else 18 + (n - 21) % 3) * each  # at 21: back to 18
        for n, obj in enumerate(held[30:], start=1):
            second.get((obj,), lambda: "y" * 1000)
            assert memo_bytes() <= 20 * each and second.bytes == n * each  # the largest gave way
        assert first.bytes == 9 * each and memo_bytes() == 19 * each
        assert first.get((held[0],), lambda: "again") == "again"  # given up: computed again
        assert first.get((held[29],), lambda: "again") == "x" * 1000  # the newest stayed
    finally:
        set_memo_bytes(DEFAULT_MEMO_BYTES)
        first.clear()
        second.clear()


def test_a_result_changed_in_place_is_weighed_again() -> None:
    memo: IdentityMemo[dict[str, str]] = IdentityMemo(10)
    obj = object()
    held = memo.get((obj,), dict)
    before = memo.bytes
    held["key"] = "z" * 5000
    memo.reweigh((obj,))
    assert memo.bytes >= before + 5000
    # Grown by one key: that key and its value are weighed and added, as weighing it all says.
    whole = memo.bytes
    held["other"] = "y" * 3000
    memo.grew((obj,), held, ("other", held["other"]))
    grown = memo.bytes
    memo.reweigh((obj,))
    assert whole + 3000 < grown and abs(grown - memo.bytes) <= 200
    # A result given up and computed again since: what grew is not the memo's, and is not added.
    memo.clear()
    fresh = memo.get((obj,), dict)
    assert fresh is not held
    before = memo.bytes
    held["more"] = "w" * 5000
    memo.grew((obj,), held, ("more", held["more"]))
    assert memo.bytes == before
    memo.clear()
    assert memo.bytes == 0


def test_the_quick_weighing_of_common_types_agrees_with_the_general_one() -> None:
    """`weigh` takes exact types first; subclasses (a str enum, a named tuple), history items
    and slotted objects fall to the general reading, at every depth (a str enum at the depth
    limit is a string, not an object past it)."""
    from typing import NamedTuple

    from contextd.engine.memo import _weigh_other
    from contextd.engine.model import Representation, TextBlock
    from tests.helpers import stored_items

    class Pair(NamedTuple):
        left: object
        right: object

    item = stored_items([ItemContent(role=Role.USER, content=(TextBlock("hello"),))])[0]
    nested: object = Representation.FULL
    for depth in range(9):
        nested = (nested, [Pair(depth, nested)], {f"k{depth}": nested, depth: TextBlock("x" * depth)})
    values = [
        "text",
        b"bytes",
        None,
        True,
        3.5,
        Representation.PLACEHOLDER,
        Pair("a", 1),
        item,
        (item, [item]),
        frozenset({"a", "b"}),
        {1: {2: {3: {4: {5: {6: {7: "deep"}}}}}}},
        nested,
        object(),
    ]
    for value in values:
        for depth in range(8):
            assert weigh(value, depth) == _weigh_other(value, depth), (value, depth)


def _one_by_one(previous: list[tuple[int, str]], current: list[tuple[int, str]]) -> int:
    n = min(len(previous), len(current))
    return next((i for i in range(n) if previous[i] != current[i]), n)


@given(
    st.integers(0, 8 * SHARED_SCAN),
    st.lists(st.integers(0, 8 * SHARED_SCAN), max_size=4),
    st.integers(-3, 3),
    st.booleans(),
)
def test_the_prefix_two_renders_share_is_where_they_first_differ(
    length: int, changed: list[int], appended: int, as_tuple: bool
) -> None:
    previous = [(i, f"entry {i}") for i in range(length)]
    current = previous[: max(0, length + min(appended, 0))] + [(-k, "new") for k in range(max(appended, 0))]
    for i in changed:
        if i < len(current):
            current[i] = (i, "changed")
    expected = _one_by_one(previous, current)
    assert shared_prefix(tuple(previous) if as_tuple else previous, current) == expected
    # Equal but distinct objects are shared: a render of equal entries is the same render.
    assert shared_prefix(previous, [(seq, text) for seq, text in current]) == expected
    # What the caller knows the two share is not compared again, and changes nothing.
    for known in {0, min(1, expected), expected // 2, expected}:
        assert shared_prefix(previous, current, known) == expected


def test_what_the_caller_knows_two_sequences_share_is_taken_as_shared() -> None:
    previous = [object() for _ in range(100)]
    current = [object() for _ in range(100)]  # nothing in common
    assert shared_prefix(previous, current) == 0
    assert shared_prefix(previous, current, 40) == 40  # taken on trust: the rest is compared
    current[40:60] = previous[40:60]
    assert shared_prefix(previous, current, 40) == 60
    assert shared_prefix(previous, current[:50], 70) == 50  # never past the shorter one


def test_the_shared_prefix_of_long_views_is_found_at_either_end() -> None:
    previous = [object() for _ in range(10_000)]
    assert shared_prefix(previous, [*previous, object()]) == 10_000
    assert shared_prefix(previous, previous[:-1]) == 9_999
    for at in (0, 1, 4_999, 9_998, 9_999):
        current = list(previous)
        current[at] = object()
        assert shared_prefix(previous, current) == at
    assert shared_prefix([], previous) == 0


def test_the_budget_counts_what_its_members_hold_while_threads_fill_and_clear_them() -> None:
    """Renders run on several threads: memos and the caches by content fill, let go of results
    past their bounds and the budget, and are cleared, at once; the budget's count stays the sum
    of what they hold (a member updated outside the budget's lock was counted twice when a
    trim recounted in between: the count ran low, and the memos stayed over the budget)."""
    import sys
    import threading
    import time

    from contextd.engine import memo
    from contextd.engine.compress.text import Remembered

    clear_memos()
    by_content: Remembered[str] = Remembered(8)
    by_object: IdentityMemo[str] = IdentityMemo(100_000)
    held = [object() for _ in range(2_000)]
    stop = threading.Event()

    def fill_and_clear() -> None:
        n = 0
        while not stop.is_set():
            by_content.get(n, lambda: "v" * 20_000)
            n += 1
            if n % 50 == 0:
                by_content.clear()

    def remember() -> None:
        n = 0
        while not stop.is_set():
            by_object.get((held[n % len(held)],), lambda: "x" * 3_000)
            n += 1

    interval = sys.getswitchinterval()
    threads = [threading.Thread(target=f) for f in (fill_and_clear, remember, fill_and_clear)]
    try:
        sys.setswitchinterval(1e-6)
        set_memo_bytes(300_000)  # trims (and recounts) all the while
        for thread in threads:
            thread.start()
        time.sleep(0.5)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
        sys.setswitchinterval(interval)
        set_memo_bytes(DEFAULT_MEMO_BYTES)
    assert memo._BUDGET.held == sum(m.bytes for m in list(memo._BUDGET.memos))
    assert by_content.bytes == sum(by_content._weights.values())
    by_content.clear()
    by_object.clear()
