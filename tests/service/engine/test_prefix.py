"""The first elements of a list only ever appended to (service/contextd/engine/prefix.py)."""

from __future__ import annotations

import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contextd.engine.memo import shared_prefix
from contextd.engine.prefix import Prefix, common, held


@given(
    st.lists(st.integers(), max_size=30),
    st.data(),
)
def test_a_prefix_reads_as_the_lists_first_elements_however_the_list_grows_after(
    base: list[int], data: st.DataObject
) -> None:
    n = data.draw(st.integers(0, len(base)))
    prefix, expected = Prefix(base, n), base[:n]
    base.extend(data.draw(st.lists(st.integers(), max_size=10)))  # what the list's owner may do
    assert len(prefix) == n and list(prefix) == expected and list(reversed(prefix)) == expected[::-1]
    for index in range(-n - 2, n + 2):
        if -n <= index < n:
            assert prefix[index] == expected[index]
        else:
            with pytest.raises(IndexError):
                prefix[index]
    for _ in range(5):
        start, stop = data.draw(st.integers(-n - 2, n + 2)), data.draw(st.integers(-n - 2, n + 2))
        step = data.draw(st.sampled_from([None, 1, 2, -1, -3]))
        assert prefix[start:stop:step] == expected[start:stop:step]
    assert prefix == expected and prefix == tuple(expected) and prefix != [*expected, 0]
    copied = pickle.loads(pickle.dumps(prefix))
    assert copied == expected and len(copied.base) == n  # (its elements only, not those after)
    assert (1 in prefix) == (1 in expected) and prefix.count(0) == expected.count(0)


def test_prefixes_of_one_list_share_the_shorter_uncompared_and_others_are_compared() -> None:
    base = [object() for _ in range(10)]
    assert common(Prefix(base, 4), Prefix(base, 7)) == 4 == shared_prefix(Prefix(base, 7), Prefix(base, 4))
    other = list(base)
    assert common(Prefix(base, 4), Prefix(other, 7)) is None
    assert shared_prefix(Prefix(base, 7), Prefix(other, 9)) == 7  # the same objects: compared
    other[3] = object()
    assert shared_prefix(Prefix(base, 7), Prefix(other, 9)) == 3
    assert shared_prefix(Prefix(base, 7), other) == 3 and shared_prefix(tuple(other), Prefix(base, 7)) == 3
    assert Prefix(base, 4) == Prefix(base, 4) and Prefix(base, 4) != Prefix(base, 5)
    assert Prefix(base, 4) == Prefix(list(base), 4) and Prefix(base, 4) != Prefix(other, 4)


def test_what_is_held_of_a_prefix_is_a_prefix_of_its_list_and_of_anything_else_a_list_of_its_own() -> None:
    base = list(range(10))
    kept = held(Prefix(base, 8), 5)
    assert isinstance(kept, Prefix) and kept.base is base and list(kept) == [0, 1, 2, 3, 4]
    assert isinstance(held(Prefix(base, 8)), Prefix) and len(held(Prefix(base, 8), 20)) == 8
    as_list = held(base, 5)
    base[0] = 99
    assert as_list == [0, 1, 2, 3, 4] and held((1, 2, 3)) == [1, 2, 3]
    with pytest.raises(ValueError, match="a prefix of 11 elements of a list of 10"):
        Prefix(base, 11)
