"""Canonical JSON form of content blocks, and the content hash built on it.

Storage keeps an item's blocks in this form; the content hash is the
SHA-256 of its canonical serialization, so the hash never depends on how a
client or a database happened to order keys.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Iterable, Sequence
from typing import Any

from contextd.engine.model import (
    Block,
    DocumentBlock,
    ImageBlock,
    ItemContent,
    ReasoningBlock,
    ResultPart,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)

JsonObject = dict[str, Any]


def b64_text(data: bytes) -> str:
    """`data` as base64 text, the way JSON documents carry bytes."""
    return base64.b64encode(data).decode("ascii")


def block_to_json(block: Block) -> JsonObject:
    """One block as a JSON-ready dict; defaults are left out."""
    out: JsonObject
    match block:
        case TextBlock(text, item_id):
            out = {"type": "text", "text": text}
            if item_id:
                out["item_id"] = item_id
            return out
        case ToolUseBlock(id, name, input_json, item_id):
            out = {"type": "tool_use", "id": id, "name": name, "input_json": input_json}
            if item_id:
                out["item_id"] = item_id
            return out
        case ToolResultBlock(tool_use_id, content, is_error, name):
            out = {"type": "tool_result", "tool_use_id": tool_use_id, "content": blocks_to_json(content)}
            if is_error:
                out["is_error"] = True
            if name:
                out["name"] = name
            return out
        case ImageBlock(media_type, data, uri, detail):
            out = {"type": "image", "media_type": media_type}
            _put_source(out, data, uri, None)
            if detail:
                out["detail"] = detail
            return out
        case DocumentBlock(media_type, data, uri, text, title):
            out = {"type": "document", "media_type": media_type}
            _put_source(out, data, uri, text)
            if title:
                out["title"] = title
            return out
        case ReasoningBlock(text, signature, redacted_data, item_id, encrypted_content):
            out = {"type": "reasoning", "text": text}
            for key, value in (
                ("signature", signature),
                ("redacted_data", redacted_data),
                ("item_id", item_id),
                ("encrypted_content", encrypted_content),
            ):
                if value:
                    out[key] = value
            return out
    raise TypeError(f"not a content block: {block!r}")


def _put_source(out: JsonObject, data: bytes | None, uri: str | None, text: str | None) -> None:
    if data is not None:
        out["data_b64"] = b64_text(data)
    elif uri is not None:
        out["uri"] = uri
    elif text is not None:
        out["text"] = text


def blocks_to_json(blocks: Iterable[Block]) -> list[JsonObject]:
    return [block_to_json(b) for b in blocks]


def block_from_json(obj: JsonObject) -> Block:
    kind = obj["type"]
    if kind == "text":
        return TextBlock(obj["text"], obj.get("item_id", ""))
    if kind == "tool_use":
        return ToolUseBlock(obj["id"], obj["name"], obj["input_json"], obj.get("item_id", ""))
    if kind == "tool_result":
        return ToolResultBlock(
            tool_use_id=obj["tool_use_id"],
            content=tuple(_result_part(p) for p in obj.get("content", ())),
            is_error=bool(obj.get("is_error", False)),
            name=obj.get("name", ""),
        )
    data = base64.b64decode(obj["data_b64"]) if "data_b64" in obj else None
    if kind == "image":
        return ImageBlock(obj["media_type"], data, obj.get("uri"), obj.get("detail", ""))
    if kind == "document":
        return DocumentBlock(obj["media_type"], data, obj.get("uri"), obj.get("text"), obj.get("title", ""))
    if kind == "reasoning":
        return ReasoningBlock(
            obj.get("text", ""),
            obj.get("signature", ""),
            obj.get("redacted_data", ""),
            obj.get("item_id", ""),
            obj.get("encrypted_content", ""),
        )
    raise ValueError(f"unknown block type {kind!r}")


def _result_part(obj: JsonObject) -> ResultPart:
    block = block_from_json(obj)
    if not isinstance(block, TextBlock | ImageBlock | DocumentBlock):
        raise ValueError(f"a tool result cannot hold a {obj['type']!r} block")
    return block


def blocks_from_json(objs: Sequence[JsonObject]) -> tuple[Block, ...]:
    return tuple(block_from_json(o) for o in objs)


JSON_PART = 256
"""Elements of a long list that `compact_json` encodes at a time."""


def compact_json(value: Any) -> str:
    """`json.dumps(value, separators=(",", ":"), ensure_ascii=False)`, byte for byte, written a
    part at a time: the encoder, C code, holds the interpreter lock until it returns, and a long
    session's view state is megabytes (4.6 MB at 20,000 items, 117 ms in one stretch) during
    which no other thread moves (the event loop's calls, other renders). Objects with string
    keys are written a member at a time, long lists `JSON_PART` elements at a time; another
    thread takes the lock between them."""
    if isinstance(value, dict) and all(isinstance(key, str) for key in value):
        return "{" + ",".join(f"{_compact(key)}:{compact_json(member)}" for key, member in value.items()) + "}"
    if isinstance(value, list | tuple) and len(value) > JSON_PART:
        parts = (compact_json(value[at : at + JSON_PART])[1:-1] for at in range(0, len(value), JSON_PART))
        return "[" + ",".join(parts) + "]"
    return _compact(value)


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def canonical_json(value: Any) -> bytes:
    """Key-sorted, whitespace-free UTF-8 JSON: the same value always gives the same bytes."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _hashed_fields(obj: JsonObject) -> JsonObject:
    # A tool result's name is optional on input and filled in by the service
    # from its call, after the hash is taken at append: hashing it would make
    # the hash depend on whether the client happened to send it.
    dropped = ("id", "tool_use_id", "name") if obj["type"] == "tool_result" else ("id",)
    return {k: v for k, v in obj.items() if k not in dropped}


def content_hash(item: ItemContent) -> str:
    """SHA-256 (hex) of the item's role, name and blocks.

    Tool call ids (and a tool result's tool name, derived from its call) are
    left out, so byte-identical outputs of two different calls share a hash:
    that is what exact-duplicate detection compares.
    """
    blocks = [_hashed_fields(b) for b in blocks_to_json(item.content)]
    return hashlib.sha256(canonical_json({"role": item.role.value, "name": item.name, "blocks": blocks})).hexdigest()


def item_to_json(item: ItemContent) -> JsonObject:
    """Everything a client submitted for an item, as a JSON-ready dict."""
    out: JsonObject = {"role": item.role.value, "blocks": blocks_to_json(item.content)}
    if item.name:
        out["name"] = item.name
    if item.source is not None:
        observed = item.source.observed_at.isoformat() if item.source.observed_at else None
        out["source"] = {"uri": item.source.uri, "version": item.source.version, "observed_at": observed}
    if item.tool_effect is not None:
        out["tool_effect"] = {"kind": item.tool_effect.kind.value, "source_arg": item.tool_effect.source_arg}
    if item.metadata:
        out["metadata"] = dict(item.metadata)
    return out
