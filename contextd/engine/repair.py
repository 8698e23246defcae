"""Invariant repair, the last stage before rendering (DESIGN principle 6).

Whatever the edits did, the view keeps the providers' message rules:

* every tool result follows the turn that made its call, directly: results
  that history put after other items are moved up to their call;
* a result whose call is not in the view is left out; a call whose result
  was left out gets the result back as a placeholder (pairs go together);
* no entry is empty;
* the conversation opens with a user turn (the Messages API requires it):
  a user item that an edit left out before the first shown turn comes back
  as a placeholder.

Reasoning the provider needs back with a turn's calls is kept when edits
are applied (placeholders.with_calls), not here.
"""

from __future__ import annotations

from collections.abc import Sequence

from contextd.engine.model import Representation, Role, ToolUseBlock
from contextd.engine.placeholders import placeholder_blocks
from contextd.engine.render.base import ViewWarning
from contextd.engine.tokens import TokenCounter, block_tokens
from contextd.engine.transforms import Entry


def repair(entries: Sequence[Entry], counter: TokenCounter) -> tuple[list[Entry], list[ViewWarning]]:
    """The entries in an order and form every provider accepts, and what was changed."""
    warnings: list[ViewWarning] = []
    shown = [e if e.content or e.role is Role.TOOL else _omit(e) for e in entries]
    _open_with_user(shown, warnings, counter)

    # Each tool call's result entry, wherever history put it.
    results: dict[str, Entry] = {}
    for entry in shown:
        result = entry.item.tool_result
        if result is not None:
            results[result.tool_use_id] = entry
    answers = {id(e) for e in results.values()}
    placed: set[int] = set()
    ordered: list[Entry] = []
    for entry in shown:
        if id(entry) in answers:
            continue  # placed right after its call, below
        ordered.append(entry)
        if entry.representation is Representation.OMITTED:
            continue
        for call in (b for b in entry.content if isinstance(b, ToolUseBlock)):
            answer = results.get(call.id)
            if answer is None:
                warnings.append(
                    ViewWarning("TOOL_CALL_UNANSWERED", f"seq {entry.seq}: call {call.id} has no result yet")
                )
                continue
            if answer.representation is Representation.OMITTED:
                answer = _as_placeholder(answer, "paired call kept", counter)
                warnings.append(
                    ViewWarning("REPAIR_RESULT_RESTORED", f"seq {answer.seq}: restored as a placeholder for its call")
                )
            ordered.append(answer)
            placed.add(answer.seq)
    for entry in shown:
        if id(entry) in answers and entry.seq not in placed:
            if entry.representation is not Representation.OMITTED:
                warnings.append(ViewWarning("REPAIR_RESULT_DROPPED", f"seq {entry.seq}: its call is not in the view"))
            ordered.append(_omit(entry))
    return ordered, warnings


def _open_with_user(entries: list[Entry], warnings: list[ViewWarning], counter: TokenCounter) -> None:
    for index, entry in enumerate(entries):
        if entry.role is Role.SYSTEM or entry.representation is Representation.OMITTED:
            continue
        if entry.role is Role.USER:
            return
        for earlier in range(index - 1, -1, -1):
            left_out = entries[earlier]
            if left_out.role is Role.USER and left_out.representation is Representation.OMITTED:
                entries[earlier] = _as_placeholder(left_out, "opens the conversation", counter)
                warnings.append(
                    ViewWarning("REPAIR_OPENING_RESTORED", f"seq {left_out.seq}: restored as a placeholder")
                )
                return
        return


def _as_placeholder(entry: Entry, reason: str, counter: TokenCounter) -> Entry:
    blocks = placeholder_blocks(entry.item, reason)
    tokens = sum(block_tokens(b, counter) for b in blocks)
    return entry._replace(content=blocks, representation=Representation.PLACEHOLDER, tokens=tokens)


def _omit(entry: Entry) -> Entry:
    return entry._replace(content=(), representation=Representation.OMITTED, tokens=0)
