"""A render's state change (engine/changes.py), as stored, makes the render's state from the
one before: checked on every render of the carry property tests (test_pipeline.py and
test_carry_strategies.py call `assert_change_makes`), and here on its own edges."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from contextd.engine.changes import StateChange, advance, change_from_json, change_to_json
from contextd.engine.pipeline import RenderOutput
from contextd.engine.state import PreviousRender, Segment, ViewState, state_from_json, state_to_json


def assert_change_makes(before: ViewState, out: RenderOutput) -> None:
    """The change `out` carries, through its JSON, makes `out.state` from `before`, and so
    does the state's own JSON."""
    assert out.change is not None
    stored = change_from_json(change_to_json(out.change))
    assert advance(before, stored) == out.state
    assert advance(state_from_json(state_to_json(before)), stored) == state_from_json(state_to_json(out.state))


def test_a_change_applies_only_to_the_version_before_it() -> None:
    change = StateChange(3, 10, "", frozenset(), (), (), frozenset(), "openai_chat", _render(), 0, ())
    with pytest.raises(ValueError, match="a change to version 3 does not follow version 1"):
        advance(ViewState(view_version=1), change)


def _render() -> PreviousRender:

    return PreviousRender(0.0, ())


class Walked(tuple[Segment, ...]):
    """Segments that count the walks over them."""

    walks = 0

    def __iter__(self) -> Iterator[Segment]:
        Walked.walks += 1
        return super().__iter__()


def test_a_record_read_or_caught_up_counts_its_total_and_offsets_once() -> None:
    """A render's record read back or caught up by changes (none of its render's counts with it)
    is asked for its total and offsets several times by each render from it: counted from the
    segments at the first, held after."""
    segments = Walked((Segment(1, "", 5), Segment(2, "", 7), Segment(2, "b", 3), Segment(4, "", 1)))
    record = PreviousRender(1.0, segments)
    Walked.walks = 0
    assert [record.total_tokens for _ in range(3)] == [16, 16, 16]
    assert [record.offsets() for _ in range(3)] == [{1: 0, 2: 5, 4: 15}] * 3
    assert Walked.walks == 2
