"""How many messages a draft's entries render to, for the framing each message costs: what the
budget prices (stages/budget.py). A fold over the entries in order, carried with the draft
(`Draft.message_count`) and taken up where the entries first differ from those it counted."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

from contextd.engine.memo import shared_prefix
from contextd.engine.model import Block, Representation, Role, TextBlock
from contextd.engine.stages.draft import Draft, MessageCount
from contextd.engine.types import Entry
from contextd.engine.view import ViewFormat


def count_messages(draft: Draft, fmt: ViewFormat) -> int:
    """How many messages (with the system field) the draft's entries render to, for their
    framing: one per entry shown for Chat Completions; for Responses, one per item an assistant
    turn splits into; for Messages and Converse, the leading system items make one field and
    consecutive items of one side merge (in Messages, a lone text never takes more). Counted on
    from where the entries first differ from those the last count of a draft this one follows
    counted (`Draft.message_count`): the count is a fold over the entries in order."""
    entries = draft.ordered()
    last = draft.message_count
    same = 0
    if last is not None and last.format is fmt:
        same = shared_prefix(last.entries, entries)  # (blocks of the draft's: compared block by block)
    # The draft's count is this one's to go on from (no other holds it): cut back in place.
    after = last.after if last is not None and same else []
    del after[same:]
    state = after[-1] if after else _OPENING
    fold = (
        _fold_chat
        if fmt is ViewFormat.OPENAI_CHAT
        else _fold_responses
        if fmt is ViewFormat.OPENAI_RESPONSES
        else (partial(_fold_merged, merges_after_text=fmt is ViewFormat.BEDROCK_CONVERSE))
    )
    for entry in entries[same:]:
        state = fold(state, entry)
        after.append(state)
    draft.message_count = MessageCount(fmt, entries, after)
    return state[0]


_Fold = tuple[int, str | None, bool, bool]
"""After an entry: messages so far, the side of the last one, whether it is closed (a lone text
in Messages), whether only system items came before."""
_OPENING: _Fold = (0, None, True, True)


def _fold_chat(state: _Fold, entry: Entry) -> _Fold:
    return state if entry.representation is Representation.OMITTED else (state[0] + 1, None, True, False)


def _fold_responses(state: _Fold, entry: Entry) -> _Fold:
    if entry.representation is Representation.OMITTED:
        return state
    return (state[0] + (_turn_items(entry.content) if entry.role is Role.ASSISTANT else 1), None, True, False)


def _fold_merged(state: _Fold, entry: Entry, *, merges_after_text: bool) -> _Fold:
    if entry.representation is Representation.OMITTED:
        return state
    total, side, closed, leading = state
    if entry.role is Role.SYSTEM and leading:
        return (total + (1 if side != "system" else 0), "system", closed, True)
    this = "assistant" if entry.role is Role.ASSISTANT else "user"
    if this != side or closed:
        total += 1
    lone_text = len(entry.content) == 1 and isinstance(entry.content[0], TextBlock)
    return (total, this, not merges_after_text and lone_text, False)


def _turn_items(content: Sequence[Block]) -> int:
    """Responses items of an assistant turn: each reasoning and call, and each run of text."""
    count, texting = 0, False
    for block in content:
        text = isinstance(block, TextBlock)
        count += 0 if text and texting else 1
        texting = text
    return count
