"""Placeholders carry identity, never content (DESIGN principle 8).

A removed item leaves a mechanical marker: what it was (kind, tool, a digest
of the arguments), why it went (the reason code) and the handle that gets
it back. No paraphrase of the content is ever generated here.

The marker keeps what the provider's message rules need: a tool result stays
a tool_result for its call, and an assistant turn keeps its tool calls (and
the signed reasoning that precedes them), so every call still has its
answer and every answer its call.
"""

from __future__ import annotations

import hashlib
import re

from contextd.engine.codec import canonical_json, item_to_json
from contextd.engine.memo import IdentityMemo
from contextd.engine.model import (
    Block,
    Item,
    ReasoningBlock,
    Role,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)

PREFIX = "[contextd:"


_handles: IdentityMemo[str] = IdentityMemo(100_000)


def handle_of(item: Item) -> str:
    """16 hex characters of the SHA-256 of the item's original content: the key to get it back."""
    # Every render shows the handles of all the items edits keep out of it.
    return _handles.get((item,), lambda: hashlib.sha256(canonical_json(item_to_json(item))).hexdigest()[:16])


def arguments_digest(input_json: str) -> str:
    return "sha256:" + hashlib.sha256(input_json.encode()).hexdigest()[:8]


def describe(item: Item) -> str:
    """What the item was, by identity only: kind, tool and argument digests."""
    result = item.tool_result
    if result is not None:
        return (
            f"output of tool call {result.tool_use_id} ({result.name or 'tool'}{', error' if result.is_error else ''})"
        )
    calls = item.tool_uses
    if calls:
        named = ", ".join(f"{c.name}({arguments_digest(c.input_json)})" for c in calls)
        return f"{item.role.value} turn calling {named}"
    return f"{item.role.value} turn"


def placeholder_text(item: Item, reason: str, handle: str, note: str = "") -> str:
    why = f"{reason}: {note}" if note else reason
    return f"{PREFIX} {describe(item)} removed ({why}); retrieve with handle {handle}]"


def turns_text(first: int, last: int, turns: int, reason: str, note: str) -> str:
    """The marker that stands for whole turns left out together (items `first` to `last`, calls
    and their results alike): what they were by their seqs, since a handle each would cost as
    much as the turns' own calls."""
    return (
        f"{PREFIX} items {first} to {last} ({turns} turn{'s' if turns != 1 else ''}) removed ({reason}: {note});"
        " retrieve any of them by its seq]"
    )


def turns_note(first: int, last: int) -> str:
    """The note of the edit that puts the marker of whole turns, items `first` to `last`, in
    place of the first: the run's identity in the view state."""
    return f"items {first} to {last}"


_TURNS = re.compile(r"items (\d+) to (\d+)")


def turns_in(note: str) -> range | None:
    """The seqs a marker of whole turns stands for, from its edit's note (None for another note)."""
    found = _TURNS.fullmatch(note)
    return range(int(found[1]), int(found[2]) + 1) if found else None


def placeholder_blocks(item: Item, reason: str, note: str = "") -> tuple[Block, ...]:
    """The blocks that stand in for `item` in a view."""
    text = TextBlock(placeholder_text(item, reason, handle_of(item), note))
    result = item.tool_result
    if result is not None:
        return (ToolResultBlock(result.tool_use_id, (text,), result.is_error, result.name),)
    if item.role is Role.ASSISTANT and item.tool_uses:
        return with_calls((text,), item.content)
    return (text,)


def with_calls(
    texts: tuple[Block, ...], original: tuple[Block, ...], calls: tuple[ToolUseBlock, ...] = ()
) -> tuple[Block, ...]:
    """`texts` in an assistant turn that keeps its original tool calls (or `calls`, the same
    calls with stand-ins for their inputs) and signed reasoning.

    Pairing needs the calls; providers that sign reasoning want it sent back,
    first in the turn, with the calls it led to.
    """
    signed = tuple(b for b in original if isinstance(b, ReasoningBlock) and b.opaque)
    return (*signed, *texts, *(calls or tuple(b for b in original if isinstance(b, ToolUseBlock))))
