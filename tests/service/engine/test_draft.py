"""The draft a render applies its edits to (service/contextd/engine/stages/draft.py): the lists
it hands out stay as they were given, and a draft appended to in place is the draft of the
whole history."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from contextd.engine.blocks import BLOCK
from contextd.engine.memo import shared_prefix
from contextd.engine.model import Item, ItemContent, Role, TextBlock
from contextd.engine.stages.draft import Draft
from contextd.engine.state import AppliedEdit
from contextd.engine.types import Insert, Remove, Reorder, Replace
from tests.helpers import stored_items


def _items(n: int) -> list[Item]:
    contents = [ItemContent(role=Role.USER, content=(TextBlock("Fix parse_header in src/app.py."),))]
    contents += [
        ItemContent(role=Role.ASSISTANT if i % 2 else Role.USER, content=(TextBlock(f"turn {i}: " + "word " * i),))
        for i in range(1, n)
    ]
    return stored_items(contents)


def _reduced(seq: int) -> AppliedEdit:
    reduced = (TextBlock(f"[{seq} reduced]"),)
    return AppliedEdit(Replace(seq, reduced), "rule", "reason", reduced, 1)


def _listed(draft: Draft) -> list[object]:
    """The entries in view order, listed from the draft's maps afresh."""
    return list(draft._in_view_order())


def test_an_edit_leaves_the_entries_handed_out_as_they_were() -> None:
    draft = Draft(_items(12), frozenset(), {})
    given = draft.ordered()
    before = list(given)
    draft.apply(_reduced(5))
    assert given == before  # the previous render's repair and assembly hold such a list
    after = draft.ordered()
    assert after is not given and after == _listed(draft)
    assert after[4].content == (TextBlock("[5 reduced]"),)
    draft.apply(_reduced(7))
    draft.apply(_reduced(8))  # the copy the first made is the draft's own: changed in place
    assert after[6].content != (TextBlock("[7 reduced]"),)
    assert draft.ordered() == _listed(draft)
    draft.apply(AppliedEdit(Remove(9), "rule", "reason", (TextBlock("gone"),), 1))
    assert draft.ordered() == _listed(draft)


def test_once_content_is_inserted_the_entries_are_listed_again() -> None:
    draft = Draft(_items(8), frozenset(), {})
    draft.ordered()
    inserted = ItemContent(role=Role.USER, content=(TextBlock("a note"),))
    draft.apply(AppliedEdit(Insert(3, inserted), "rule", "reason", inserted.content, 2))
    draft.apply(_reduced(6))
    ordered = draft.ordered()
    assert ordered == _listed(draft) and [e.seq for e in ordered][:5] == [1, 2, 3, -1, 4]


def test_a_draft_appended_to_in_place_is_the_draft_of_the_whole_history() -> None:
    items = _items(20)
    edits = [_reduced(3), _reduced(8)]
    carried = Draft(items[:10], frozenset(), {})
    for edit in edits:
        carried.apply(edit)
    handed = carried.ordered()
    kept = list(handed)
    carried.append(items, frozenset())
    fresh = Draft(items, frozenset(), {})
    for edit in edits:
        fresh.apply(edit)
    assert handed == kept
    assert carried.ordered() == fresh.ordered() == _listed(carried)
    assert carried.entries == fresh.entries and carried.natural == fresh.natural and carried.order == fresh.order
    assert (carried.turns, carried.view_tokens, carried.history_tokens) == (
        fresh.turns,
        fresh.view_tokens,
        fresh.history_tokens,
    )
    carried.apply(_reduced(15))
    fresh.apply(_reduced(15))
    assert carried.ordered() == fresh.ordered()


def _equal_prefix(given: Sequence[object], current: Sequence[object]) -> int:
    n = min(len(given), len(current))
    return next((i for i in range(n) if given[i] != current[i]), n)


_STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("reduce"), st.floats(0, 1)),
        st.tuples(st.just("append"), st.integers(1, BLOCK)),
        st.tuples(st.just("hand out"), st.just(0)),
        st.tuples(st.just("insert"), st.floats(0, 1)),
        st.tuples(st.just("reorder"), st.just(0)),
    ),
    max_size=25,
)
_MANY = _items(3 * BLOCK)


@settings(deadline=None)
@given(_STEPS, st.integers(1, 2 * BLOCK))
def test_the_entries_handed_out_stay_as_they_were_and_compare_with_later_ones_as_lists_do(
    steps: list[tuple[str, float]], length: int
) -> None:
    """What `Draft.ordered()` hands out (blocks shared from one hand-out to the next) never
    changes, whatever edits, appends, insertions and reorders come after, and
    `memo.shared_prefix` finds where two of them first differ, as it would of two lists."""
    draft = Draft(_MANY[:length], frozenset(), {})
    handed = [(draft.ordered(), _listed(draft))]
    for step, arg in steps:
        at = 1 + int(arg * (length - 1))
        if step == "reduce":
            draft.apply(_reduced(at))
        elif step == "append":
            length = min(length + int(arg), len(_MANY))
            draft.append(_MANY[:length], frozenset())
        elif step == "hand out":
            handed.append((draft.ordered(), _listed(draft)))
        elif step == "insert":
            note = ItemContent(role=Role.USER, content=(TextBlock("a note"),))
            draft.apply(AppliedEdit(Insert(at, note), "rule", "reason", note.content, 2))
        elif step == "reorder":
            draft.apply(AppliedEdit(Reorder(tuple(reversed(draft.order))), "rule", "reason"))
    current = draft.ordered()
    assert current == _listed(draft) and draft.ordered() is current  # (nothing changed: the same)
    for given_blocks, as_listed in handed:
        assert list(given_blocks) == as_listed
        assert shared_prefix(given_blocks, current) == _equal_prefix(as_listed, list(current))


def test_entries_handed_out_share_their_blocks_up_to_the_first_edit_since() -> None:
    items = _items(3 * BLOCK)
    draft = Draft(items[: 2 * BLOCK + 10], frozenset(), {})
    first = draft.ordered()
    draft.apply(_reduced(BLOCK + 7))
    draft.append(items, frozenset())
    second = draft.ordered()
    assert second.blocks[0] is first.blocks[0] and second.blocks[1] is not first.blocks[1]
    assert shared_prefix(first, second) == BLOCK + 6 and shared_prefix(second, first) == BLOCK + 6
    draft.apply(_reduced(4))
    latest = draft.ordered()
    assert shared_prefix(second, latest) == 3
    assert all(a is b for a, b in zip(latest.blocks[1:], second.blocks[1:], strict=True))  # (shared)
