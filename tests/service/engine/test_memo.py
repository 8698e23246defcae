"""Results remembered per object (service/contextd/engine/memo.py)."""

from __future__ import annotations

from contextd.engine.memo import (
    DEFAULT_MEMO_BYTES,
    ENTRY_BYTES,
    IdentityMemo,
    clear_memos,
    memo_bytes,
    set_memo_bytes,
    weigh,
)


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
    clear_memos()  # the engine's own: only this test's hold anything
    first: IdentityMemo[str] = IdentityMemo(1000)
    second: IdentityMemo[str] = IdentityMemo(1000)
    held = [object() for _ in range(40)]
    each = ENTRY_BYTES + weigh("x" * 1000)
    try:
        set_memo_bytes(20 * each)
        for obj in held[:30]:
            first.get((obj,), lambda: "x" * 1000)
        assert first.bytes == 20 * each  # the oldest 10 went
        for obj in held[30:]:
            second.get((obj,), lambda: "y" * 1000)
        assert first.bytes == 10 * each and second.bytes == 10 * each  # the largest gave way
        assert memo_bytes() == 20 * each
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
    memo.clear()
    assert memo.bytes == 0
