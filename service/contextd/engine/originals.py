"""The original of an item as text: what Retrieve pages through and the stash holds.

A tool output is its text; other items are their text blocks, then their
tool calls (``name {arguments}``), one block after another. Images and
binary documents cannot be text: they are named (``[image: image/png, 48,213
bytes]``) and come back whole only through the item itself (RenderView
with the item pinned).
"""

from __future__ import annotations

from contextd.engine.model import (
    Block,
    DocumentBlock,
    ImageBlock,
    ItemContent,
    ReasoningBlock,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)


def original_text(item: ItemContent) -> str:
    return "\n".join(_text(block) for block in item.content)


def _text(block: Block) -> str:
    match block:
        case TextBlock(text):
            return text
        case ToolResultBlock(content=parts):
            return "\n".join(_text(p) for p in parts)
        case ToolUseBlock(_, name, input_json):
            return f"{name} {input_json}"
        case ReasoningBlock(text):
            return text
        case DocumentBlock(text=text) if text is not None:
            return text
        case ImageBlock(media_type, data, uri) | DocumentBlock(media_type, data, uri):
            where = f"{len(data):,} bytes" if data is not None else uri or ""
            kind = "image" if isinstance(block, ImageBlock) else "document"
            return f"[{kind}: {media_type}, {where}]"
    raise TypeError(f"not a content block: {block!r}")
