"""What one render changed in a session's view state, and how to make the state from the one
before with it.

A long session's state is large (every edit in force with what it shows: megabytes at ten
thousand items), and a render changes little of it: an edit or two, the deferred edits,
the refusals it certified, what it sent. Storing that change instead of the whole state
makes a render's write proportional to what it did, and lets a replica that holds an
earlier state catch up by the changes since (storage/contextd_storage/views.py keeps them
between full copies). `advance(before, change)` is the state the render produced, equal to
it field by field (tests/service/engine/test_changes.py).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from contextd.engine.codec import compact_json
from contextd.engine.memo import shared_prefix
from contextd.engine.state import (
    AppliedEdit,
    PendingEdit,
    PreviousRender,
    Segment,
    Slot,
    ViewState,
    applied_from_json,
    applied_to_json,
    early_from_json,
    pending_from_json,
    pending_to_json,
    slot_of,
)


@dataclass(frozen=True, slots=True)
class StateChange:
    """One render's change to the view state."""

    view_version: int
    """The version of the state it makes (the state before it is one less)."""
    items: int
    """The history version the render saw."""
    policy_version: str
    removed: frozenset[Slot]
    """The slots of edits in force before and not after (taken over, undone, made history)."""
    added: tuple[AppliedEdit, ...]
    """The edits the render applied, in order, after those that stay."""
    pending: tuple[PendingEdit, ...]
    """The deferred edits after the render (all of them)."""
    decided: frozenset[str]
    """The refusals the render certified (ViewState.decided grows by these)."""
    format: str
    """The view format it rendered."""
    render: PreviousRender
    """What it sent; its segments are those it shares with the previous render in its format
    (`kept`), then `segments`."""
    kept: int
    segments: tuple[Segment, ...]


def change_of(
    before: ViewState,
    after: ViewState,
    fmt: str,
    items: int,
    kept_in_force: Sequence[AppliedEdit],
    added: Sequence[AppliedEdit],
    shared: int | None = None,
) -> StateChange:
    """The change a render made: `after` is `before` with the edits in force `kept_in_force`
    (in order, a part of `before.applied`), then `added`; `shared`: the segments its render
    shares with the previous one in `fmt` (`shared_prefix`), when known."""
    removed: frozenset[Slot] = frozenset()
    if len(kept_in_force) != len(before.applied):
        kept = {slot_of(a.edit) for a in kept_in_force}
        removed = frozenset(s for s in map(slot_of, (a.edit for a in before.applied)) if s not in kept)
    render = after.renders[fmt]
    previous = before.renders.get(fmt)
    if previous is None:
        shared = 0
    elif shared is None:
        shared = shared_prefix(previous.segments, render.segments)
    return StateChange(
        view_version=after.view_version,
        items=items,
        policy_version=after.policy_version,
        removed=removed,
        added=tuple(added),
        pending=after.pending,
        decided=after.decided - before.decided,
        format=fmt,
        render=render,
        kept=shared,
        segments=tuple(render.segments[shared:]),  # (a slice of `Blocks` is a tuple: not copied again)
    )


def advance(before: ViewState, change: StateChange) -> ViewState:
    """The state `change` makes from `before` (the state one version before it)."""
    if change.view_version != before.view_version + 1:
        raise ValueError(f"a change to version {change.view_version} does not follow version {before.view_version}")
    applied = before.applied
    if change.removed:
        applied = tuple(a for a in applied if slot_of(a.edit) not in change.removed)
    previous = before.renders.get(change.format)
    kept = previous.segments[: change.kept] if previous is not None else ()
    r = change.render
    render = PreviousRender(
        r.rendered_at,
        (*kept, *change.segments),
        r.view_tokens,
        r.budget_tokens,
        r.cached_ends,
        r.cached_through,
        r.early,
        r.history_tokens,
        r.banked,
    )
    return ViewState(
        view_version=change.view_version,
        policy_version=change.policy_version,
        renders={**before.renders, change.format: render},
        applied=(*applied, *change.added),
        pending=change.pending,
        decided=before.decided | change.decided,
    )


def change_to_json(change: StateChange) -> str:
    r = change.render
    data: dict[str, Any] = {
        "view_version": change.view_version,
        "items": change.items,
        "policy_version": change.policy_version,
        "removed": sorted(change.removed, key=lambda s: (isinstance(s, str), s)),
        "added": [applied_to_json(a) for a in change.added],
        "pending": [pending_to_json(p) for p in change.pending],
        "decided": sorted(change.decided),
        "format": change.format,
        "rendered_at": r.rendered_at,
        "view_tokens": r.view_tokens,
        "budget_tokens": r.budget_tokens,
        "cached_ends": [list(end) for end in r.cached_ends],
        "cached_through": r.cached_through,
        "early": list(r.early),
        "history_tokens": r.history_tokens,
        "banked": r.banked,
        "kept": change.kept,
        "segments": [list(s) for s in change.segments],
    }
    return compact_json(data)


def change_from_json(text: str) -> StateChange:
    data = json.loads(text)
    segments = tuple(Segment(*s) for s in data["segments"])
    render = PreviousRender(
        data["rendered_at"],
        segments,  # the tail only: `advance` puts the kept ones before it
        data["view_tokens"],
        data["budget_tokens"],
        tuple((offset, used_at) for offset, used_at in data["cached_ends"]),
        data["cached_through"],
        early_from_json(data.get("early")),
        data.get("history_tokens", 0),
        data.get("banked", 0.0),
    )
    return StateChange(
        view_version=data["view_version"],
        items=data["items"],
        policy_version=data["policy_version"],
        removed=frozenset(data["removed"]),
        added=tuple(applied_from_json(a) for a in data["added"]),
        pending=tuple(pending_from_json(p) for p in data["pending"]),
        decided=frozenset(data["decided"]),
        format=data["format"],
        render=render,
        kept=data["kept"],
        segments=segments,
    )
