"""Anthropic Messages ``system`` and ``messages`` to contextd items.

A user message can hold tool results and other blocks; each tool_result
becomes its own tool item (the unit a view keeps or prunes) and each run of
other blocks a user item, in order. The service merges them back into one
user message when it renders.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from contextd_client.formats._fields import decode_base64, require_object, require_string, split_user
from contextd_client.v1 import content_pb2 as pb


def items_from_anthropic(
    messages: Iterable[Mapping[str, Any]], system: str | Iterable[Mapping[str, Any]] | None = None
) -> list[pb.Item]:
    """Convert a Messages request's ``system`` and ``messages``; raises ValueError naming the first bad field."""
    items: list[pb.Item] = []
    if system:
        items.append(pb.Item(role=pb.ROLE_SYSTEM, content=_blocks(system, "system")))
    for i, message in enumerate(messages):
        path = f"messages[{i}]"
        message = require_object(message, path)
        role = message.get("role")
        blocks = _blocks(message.get("content"), f"{path}.content")
        if role == "assistant":
            items.append(pb.Item(role=pb.ROLE_ASSISTANT, content=blocks))
        elif role == "user":
            items.extend(split_user(blocks))
        else:
            raise ValueError(f"{path}.role: unsupported role {role!r} (user, assistant)")
    return items


def _blocks(content: str | Iterable[Mapping[str, Any]] | None, path: str) -> list[pb.ContentBlock]:
    """A content field: a string (one text block; none when empty) or a list of blocks."""
    if isinstance(content, str):
        return [_text(content)] if content else []
    if content is None:
        return []
    if isinstance(content, Mapping) or not isinstance(content, Iterable):
        raise ValueError(f"{path}: expected a string or a list of blocks, not {type(content).__name__}")
    return [_block(require_object(b, f"{path}[{k}]"), f"{path}[{k}]") for k, b in enumerate(content)]


def _text(text: str) -> pb.ContentBlock:
    return pb.ContentBlock(text=pb.TextBlock(text=text))


def _block(block: Mapping[str, Any], path: str) -> pb.ContentBlock:
    kind = block.get("type")
    if kind == "text":
        return _text(require_string(block, "text", path))
    if kind == "tool_use":
        # An object has no original text; default separators are what most
        # models emit, so arguments usually survive a trip through here.
        arguments = json.dumps(block.get("input", {}), ensure_ascii=False)
        return pb.ContentBlock(
            tool_use=pb.ToolUseBlock(
                id=require_string(block, "id", path), name=require_string(block, "name", path), input_json=arguments
            )
        )
    if kind == "tool_result":
        return pb.ContentBlock(
            tool_result=pb.ToolResultBlock(
                tool_use_id=require_string(block, "tool_use_id", path),
                content=_blocks(block.get("content"), f"{path}.content"),
                is_error=bool(block.get("is_error", False)),
            )
        )
    if kind == "image":
        image = pb.ImageBlock()
        _set_source(image, require_object(block.get("source"), f"{path}.source"), f"{path}.source")
        return pb.ContentBlock(image=image)
    if kind == "document":
        document = pb.DocumentBlock(title=block.get("title", ""))
        _set_source(document, require_object(block.get("source"), f"{path}.source"), f"{path}.source")
        return pb.ContentBlock(document=document)
    if kind == "thinking":
        return pb.ContentBlock(
            reasoning=pb.ReasoningBlock(text=block.get("thinking", ""), signature=block.get("signature", ""))
        )
    if kind == "redacted_thinking":
        return pb.ContentBlock(reasoning=pb.ReasoningBlock(redacted_data=require_string(block, "data", path)))
    raise ValueError(f"{path}.type: unsupported block {kind!r}")


def _set_source(target: pb.ImageBlock | pb.DocumentBlock, source: Mapping[str, Any], path: str) -> None:
    kind = source.get("type")
    if kind == "base64":
        target.media_type = source.get("media_type", "")
        target.data = decode_base64(require_string(source, "data", path), f"{path}.data")
    elif kind == "url":
        target.uri = require_string(source, "url", path)
    elif kind == "text" and isinstance(target, pb.DocumentBlock):
        target.media_type = source.get("media_type", "text/plain")
        target.text = require_string(source, "data", path)
    else:
        raise ValueError(f"{path}.type: unsupported source {kind!r}")
