"""Amazon Bedrock Converse ``system`` and ``messages`` to contextd items.

A user message can hold tool results and other blocks; each toolResult
becomes its own tool item (the unit a view keeps or prunes) and each run of
other blocks a user item, in order. The service merges them back into one
user message when it renders.

Bytes (image and document ``source.bytes``, ``redactedContent``) are taken
as raw ``bytes``, as boto3 and Strands hand them over, or as base64 text, as
Bedrock's HTTP API carries them. Normalized on the way in: a tool result's
``{"json": ...}`` becomes a text block of its JSON; redacted reasoning is
kept as base64 text; an empty text block is skipped (Converse sends none
back), and so is a message left with nothing. ``cachePoint`` blocks are
request marks, not content: they are skipped. A ``citationsContent`` block
(an answer with citations, as Bedrock returns it and Strands keeps it) is
kept as its text, without the citations. Strands' own form of an S3 source,
``{"location": {"type": "s3", "uri": ...}}``, is taken as the
``s3Location`` it stands for.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Mapping
from typing import Any

from contextd_client.formats._fields import decode_base64, require_object, require_string, split_user
from contextd_client.v1 import content_pb2 as pb

IMAGE_TYPES = {"png": "image/png", "jpeg": "image/jpeg", "gif": "image/gif", "webp": "image/webp"}
DOCUMENT_TYPES = {
    "pdf": "application/pdf",
    "csv": "text/csv",
    "doc": "application/msword",
    "docx": "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
    "xls": "application/vnd.ms-excel",
    "xlsx": "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
    "html": "text/html",
    "txt": "text/plain",
    "md": "text/markdown",
}


def items_from_converse(
    messages: Iterable[Mapping[str, Any]], system: Iterable[Mapping[str, Any]] | None = None
) -> list[pb.Item]:
    """Convert a Converse request's ``system`` and ``messages``; raises ValueError naming the first bad field."""
    items: list[pb.Item] = []
    if system is not None:
        texts = _system(system)
        if texts:
            items.append(pb.Item(role=pb.ROLE_SYSTEM, content=texts))
    for i, message in enumerate(messages):
        path = f"messages[{i}]"
        message = require_object(message, path)
        role = message.get("role")
        if role not in ("user", "assistant"):
            raise ValueError(f"{path}.role: unsupported role {role!r} (user, assistant)")
        blocks = _blocks(message.get("content"), f"{path}.content")
        if role == "assistant":
            if blocks:
                items.append(pb.Item(role=pb.ROLE_ASSISTANT, content=blocks))
        else:
            items.extend(split_user(blocks))
    return items


def _system(system: Iterable[Mapping[str, Any]]) -> list[pb.ContentBlock]:
    if isinstance(system, str | Mapping) or not isinstance(system, Iterable):
        raise ValueError(f"system: expected a list of blocks, not {type(system).__name__}")
    texts: list[pb.ContentBlock] = []
    for k, block in enumerate(system):
        path = f"system[{k}]"
        kind = _kind(require_object(block, path), path)
        if kind == "text":
            text = require_string(block, "text", path)
            if text:
                texts.append(_text(text))
        elif kind != "cachePoint":
            raise ValueError(f"{path}: unsupported block {kind!r}")
    return texts


def _kind(block: Mapping[str, Any], path: str) -> str:
    """The member a content block (a union: one member) sets."""
    if len(block) != 1:
        raise ValueError(f"{path}: a content block sets exactly one member, not {sorted(map(str, block))}")
    kind: str = next(iter(block))
    return kind


def _blocks(content: Any, path: str) -> list[pb.ContentBlock]:
    if isinstance(content, str | Mapping) or not isinstance(content, Iterable):
        raise ValueError(f"{path}: expected a list of blocks, not {type(content).__name__}")
    blocks: list[pb.ContentBlock] = []
    for k, block in enumerate(content):
        converted = _block(require_object(block, f"{path}[{k}]"), f"{path}[{k}]")
        if converted is not None:
            blocks.append(converted)
    return blocks


def _text(text: str) -> pb.ContentBlock:
    return pb.ContentBlock(text=pb.TextBlock(text=text))


def _block(block: Mapping[str, Any], path: str) -> pb.ContentBlock | None:
    kind = _kind(block, path)
    at = f"{path}.{kind}"
    if kind == "text":
        text = require_string(block, "text", path)
        return _text(text) if text else None
    if kind == "cachePoint":
        return None
    if kind == "toolUse":
        use = require_object(block[kind], at)
        try:
            # An object has no original text; default separators are what most
            # models emit, so arguments usually survive a trip through here.
            arguments = json.dumps(use.get("input", {}), ensure_ascii=False)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{at}.input: not JSON ({exc})") from None
        return pb.ContentBlock(
            tool_use=pb.ToolUseBlock(
                id=require_string(use, "toolUseId", at), name=require_string(use, "name", at), input_json=arguments
            )
        )
    if kind == "toolResult":
        return pb.ContentBlock(tool_result=_tool_result(require_object(block[kind], at), at))
    if kind == "image":
        return pb.ContentBlock(image=_image(require_object(block[kind], at), at))
    if kind == "document":
        return pb.ContentBlock(document=_document(require_object(block[kind], at), at))
    if kind == "reasoningContent":
        return pb.ContentBlock(reasoning=_reasoning(require_object(block[kind], at), at))
    if kind == "citationsContent":
        text = _citations_text(require_object(block[kind], at), at)
        return _text(text) if text else None
    raise ValueError(f"{path}: unsupported block {kind!r}")


def _citations_text(citations: Mapping[str, Any], path: str) -> str:
    """The generated text of a ``citationsContent`` block (its citations have no field in contextd)."""
    content = citations.get("content", [])
    if isinstance(content, str | Mapping) or not isinstance(content, Iterable):
        raise ValueError(f"{path}.content: expected a list of blocks, not {type(content).__name__}")
    return "".join(
        require_string(require_object(part, f"{path}.content[{k}]"), "text", f"{path}.content[{k}]")
        for k, part in enumerate(content)
    )


def _tool_result(result: Mapping[str, Any], path: str) -> pb.ToolResultBlock:
    status = result.get("status", "success")
    if status not in ("success", "error"):
        raise ValueError(f"{path}.status: unsupported status {status!r} (success, error)")
    content = result.get("content", [])
    if isinstance(content, str | Mapping) or not isinstance(content, Iterable):
        raise ValueError(f"{path}.content: expected a list of blocks, not {type(content).__name__}")
    parts: list[pb.ContentBlock] = []
    for k, part in enumerate(content):
        at = f"{path}.content[{k}]"
        kind = _kind(require_object(part, at), at)
        if kind == "text":
            parts.append(_text(require_string(part, "text", at)))
        elif kind == "json":
            try:
                parts.append(_text(json.dumps(part["json"], ensure_ascii=False)))
            except (TypeError, ValueError) as exc:
                raise ValueError(f"{at}.json: not JSON ({exc})") from None
        elif kind == "image":
            parts.append(pb.ContentBlock(image=_image(require_object(part[kind], f"{at}.image"), f"{at}.image")))
        elif kind == "document":
            document = _document(require_object(part[kind], f"{at}.document"), f"{at}.document")
            parts.append(pb.ContentBlock(document=document))
        else:
            raise ValueError(f"{at}: unsupported block {kind!r}")
    return pb.ToolResultBlock(
        tool_use_id=require_string(result, "toolUseId", path), content=parts, is_error=status == "error"
    )


def _image(image: Mapping[str, Any], path: str) -> pb.ImageBlock:
    fmt = image.get("format")
    if fmt not in IMAGE_TYPES:
        raise ValueError(f"{path}.format: unsupported format {fmt!r} ({', '.join(IMAGE_TYPES)})")
    target = pb.ImageBlock(media_type=IMAGE_TYPES[fmt])
    _set_source(target, require_object(image.get("source"), f"{path}.source"), f"{path}.source")
    return target


def _document(document: Mapping[str, Any], path: str) -> pb.DocumentBlock:
    source = require_object(document.get("source"), f"{path}.source")
    fmt = document.get("format")
    if fmt is None and "text" in source:
        fmt = "txt"
    if fmt not in DOCUMENT_TYPES:
        raise ValueError(f"{path}.format: unsupported format {fmt!r} ({', '.join(DOCUMENT_TYPES)})")
    target = pb.DocumentBlock(media_type=DOCUMENT_TYPES[fmt], title=require_string(document, "name", path))
    _set_source(target, source, f"{path}.source")
    return target


def _set_source(target: pb.ImageBlock | pb.DocumentBlock, source: Mapping[str, Any], path: str) -> None:
    kind = _kind(source, path)
    if kind == "bytes":
        target.data = _bytes(source[kind], f"{path}.bytes")
    elif kind == "s3Location":
        target.uri = require_string(require_object(source[kind], f"{path}.s3Location"), "uri", f"{path}.s3Location")
    elif kind == "location":  # Strands' form of the same
        location = require_object(source[kind], f"{path}.location")
        if location.get("type") != "s3":
            raise ValueError(f"{path}.location.type: unsupported location {location.get('type')!r} (s3)")
        target.uri = require_string(location, "uri", f"{path}.location")
    elif kind == "text" and isinstance(target, pb.DocumentBlock):
        target.text = require_string(source, "text", path)
    else:
        raise ValueError(f"{path}: unsupported source {kind!r}")


def _reasoning(reasoning: Mapping[str, Any], path: str) -> pb.ReasoningBlock:
    kind = _kind(reasoning, path)
    if kind == "reasoningText":
        text = require_object(reasoning[kind], f"{path}.{kind}")
        return pb.ReasoningBlock(
            text=require_string(text, "text", f"{path}.{kind}"), signature=text.get("signature") or ""
        )
    if kind == "redactedContent":
        data = reasoning[kind]
        at = f"{path}.{kind}"
        if isinstance(data, str):
            decode_base64(data, at)  # kept as it came, once known to be base64
            return pb.ReasoningBlock(redacted_data=data)
        return pb.ReasoningBlock(redacted_data=base64.b64encode(_bytes(data, at)).decode("ascii"))
    raise ValueError(f"{path}: unsupported reasoning {kind!r}")


def _bytes(data: Any, path: str) -> bytes:
    """Raw bytes (boto3, Strands) or base64 text (the JSON API)."""
    if isinstance(data, bytes | bytearray | memoryview):
        return bytes(data)
    if isinstance(data, str):
        return decode_base64(data, path)
    raise ValueError(f"{path}: expected bytes or base64 text, not {type(data).__name__}")
