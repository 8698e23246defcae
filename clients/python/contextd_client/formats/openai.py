"""OpenAI Chat Completions ``messages`` to contextd items.

One message gives one item. Text and tool-call arguments are kept byte for
byte, so the service renders them back identically. Also accepted, for
recorded trajectories: ``arguments`` as an object, a top-level ``name`` and
``arguments`` on a tool call, ``is_error`` on a tool message, and
``reasoning`` (or ``reasoning_content``) on an assistant message.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from contextd_client.formats._fields import data_uri, require_object, require_string, text_or_parts
from contextd_client.v1 import content_pb2 as pb

_ROLES = {"system": pb.ROLE_SYSTEM, "developer": pb.ROLE_SYSTEM, "user": pb.ROLE_USER}


def items_from_openai(messages: Iterable[Mapping[str, Any]]) -> list[pb.Item]:
    """Convert Chat Completions messages; raises ValueError naming the first bad field.

    A message that carries nothing (an assistant reply with empty content and
    no tool calls, an empty user message) is skipped: it has no content to keep.
    """
    items = [_item(require_object(message, f"messages[{i}]"), f"messages[{i}]") for i, message in enumerate(messages)]
    return [item for item in items if item.content]


def _item(message: Mapping[str, Any], path: str) -> pb.Item:
    role = message.get("role")
    if role == "assistant":
        item = pb.Item(role=pb.ROLE_ASSISTANT, content=_assistant_blocks(message, path))
    elif role == "tool":
        item = pb.Item(role=pb.ROLE_TOOL, content=[_tool_result(message, path)])
    elif role in _ROLES:
        item = pb.Item(role=_ROLES[role], content=_parts(message.get("content"), f"{path}.content"))
    else:
        raise ValueError(f"{path}.role: unsupported role {role!r} (system, developer, user, assistant, tool)")
    if role != "tool" and message.get("name"):
        item.name = message["name"]
    return item


def _assistant_blocks(message: Mapping[str, Any], path: str) -> list[pb.ContentBlock]:
    blocks: list[pb.ContentBlock] = []
    reasoning = message.get("reasoning") or message.get("reasoning_content")
    if reasoning:
        blocks.append(pb.ContentBlock(reasoning=pb.ReasoningBlock(text=reasoning)))
    blocks.extend(_parts(message.get("content"), f"{path}.content"))
    if message.get("refusal") and not blocks:
        blocks.append(pb.ContentBlock(text=pb.TextBlock(text=require_string(message, "refusal", path))))
    for j, call in enumerate(message.get("tool_calls") or ()):
        blocks.append(_tool_use(call, f"{path}.tool_calls[{j}]"))
    return blocks


def _tool_use(call: Mapping[str, Any], path: str) -> pb.ContentBlock:
    call = require_object(call, path)
    function = require_object(call.get("function", call), f"{path}.function")  # traces put name/arguments at the top
    # Some OpenAI-compatible servers send "" for a call without arguments.
    arguments = function.get("arguments") or "{}"
    if not isinstance(arguments, str):
        # An object has no original text; this is how the OpenAI API writes one.
        arguments = json.dumps(arguments, ensure_ascii=False)
    if not call.get("id") or not function.get("name"):
        raise ValueError(f"{path}: a tool call needs an id and a function name")
    call_id, name = require_string(call, "id", path), require_string(function, "name", f"{path}.function")
    return pb.ContentBlock(tool_use=pb.ToolUseBlock(id=call_id, name=name, input_json=arguments))


def _tool_result(message: Mapping[str, Any], path: str) -> pb.ContentBlock:
    if not message.get("tool_call_id"):
        raise ValueError(f"{path}.tool_call_id: a tool message needs the id of the call it answers")
    call_id = require_string(message, "tool_call_id", path)
    content = message.get("content")
    # An empty output is a real (empty) answer, not a missing one.
    parts = [] if content in ("", None) else _parts(content, f"{path}.content")
    return pb.ContentBlock(
        tool_result=pb.ToolResultBlock(
            tool_use_id=call_id, content=parts, is_error=bool(message.get("is_error")), name=message.get("name", "")
        )
    )


def _parts(content: Any, path: str) -> list[pb.ContentBlock]:
    return text_or_parts(content, path, _part)


def _part(part: Mapping[str, Any], path: str) -> pb.ContentBlock:
    kind = part.get("type")
    if kind == "text":
        return pb.ContentBlock(text=pb.TextBlock(text=require_string(part, "text", path)))
    if kind == "refusal":
        return pb.ContentBlock(text=pb.TextBlock(text=require_string(part, "refusal", path)))
    if kind == "image_url":
        image_url = require_object(part.get("image_url"), f"{path}.image_url")
        url = require_string(image_url, "url", f"{path}.image_url")
        image = pb.ImageBlock(detail=image_url.get("detail", ""))
        decoded = data_uri(url, path)
        if decoded is None:
            image.uri = url
        else:
            image.media_type, image.data = decoded
        return pb.ContentBlock(image=image)
    if kind == "file":
        file = require_object(part.get("file"), f"{path}.file")
        document = pb.DocumentBlock(title=file.get("filename", ""))
        if "file_data" in file:
            decoded = data_uri(file["file_data"], path)
            if decoded is None:
                raise ValueError(f"{path}.file.file_data: expected a base64 data URI")
            document.media_type, document.data = decoded
        elif "file_id" in file:
            document.uri = file["file_id"]
        else:
            raise ValueError(f"{path}.file: needs file_data or file_id")
        return pb.ContentBlock(document=document)
    raise ValueError(f"{path}.type: unsupported content part {kind!r}")
