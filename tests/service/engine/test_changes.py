"""A render's state change (engine/changes.py), as stored, makes the render's state from the
one before: checked on every render of the carry property tests (test_pipeline.py and
test_carry_strategies.py call `assert_change_makes`), and here on its own edges."""

from __future__ import annotations

import pytest

from contextd.engine.changes import StateChange, advance, change_from_json, change_to_json
from contextd.engine.pipeline import RenderOutput
from contextd.engine.state import PreviousRender, ViewState, state_from_json, state_to_json


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
