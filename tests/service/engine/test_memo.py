"""Results remembered per object (service/contextd/engine/memo.py)."""

from __future__ import annotations

from contextd.engine.memo import IdentityMemo


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
