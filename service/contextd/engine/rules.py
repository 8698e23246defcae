"""Rules are sugar over the transform primitive: `when` predicates pick the
candidates a rule's transform sees."""

from __future__ import annotations

from contextd.engine.memo import IdentityMemo
from contextd.engine.model import (
    BLOCK_KINDS,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from contextd.engine.policy import When
from contextd.engine.types import Entry, TransformContext

_texts: IdentityMemo[str] = IdentityMemo(100_000)


def text_of(entry: Entry) -> str:
    """The searchable text of an item as shown: texts, tool arguments and outputs."""
    return _texts.get((entry.content,), lambda: _text(entry))


def _text(entry: Entry) -> str:
    parts: list[str] = []
    for block in entry.content:
        if isinstance(block, TextBlock):
            parts.append(block.text)
        elif isinstance(block, ToolUseBlock):
            parts.append(block.input_json)
        elif isinstance(block, ToolResultBlock):
            parts.extend(p.text for p in block.content if isinstance(p, TextBlock))
    return "\n".join(parts)


def holds_now(when: When, entry: Entry, context: TransformContext) -> bool:
    """The conditions that change from render to render: age and budget utilization."""
    if when.age_turns is not None and not when.age_turns.holds(context.turns - 1 - entry.turn):
        return False
    return when.utilization is None or when.utilization.holds(context.utilization)


def changes_with_time(when: When) -> bool:
    return when.age_turns is not None or when.utilization is not None


def holds_for(when: When, entry: Entry) -> bool:
    """The conditions on the entry alone, which hold as long as it is shown as it is (the cheap ones first)."""
    item = entry.item
    if when.roles is not None and item.role not in when.roles:
        return False
    if when.pinned is not None and entry.pinned != when.pinned:
        return False
    if when.tokens is not None and not when.tokens.holds(entry.tokens):
        return False
    if when.tools_include or when.tools_exclude:
        result = item.tool_result
        tools = [result.name] if result else [u.name for u in item.tool_uses]
        if when.tools_include and not when.tools_include.matches_any(tools):
            return False
        if when.tools_exclude.matches_any(tools):
            return False
    if when.content_types is not None and not {BLOCK_KINDS[type(b)] for b in item.content} & when.content_types:
        return False
    if when.source_glob and (item.source is None or not when.source_glob.matches_any([item.source.uri])):
        return False
    return when.regex is None or when.regex.search(text_of(entry)) is not None
