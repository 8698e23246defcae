"""OpenAI Responses ``input`` items (or a response's ``output``) to contextd items.

A run of assistant-side items (``reasoning``, assistant ``message``,
``function_call``) becomes one assistant item, the turn a view keeps or
prunes whole; each ``function_call_output`` a tool item; each other message
one item. Ids come along (``msg_…`` on the text, ``fc_…`` on the call,
``rs_…`` with the reasoning's ``encrypted_content``), so a view in this format
sends a reasoning model's turn back paired as the API requires.

Accepted as the API accepts them: a message's content as a string or a list
of parts, with or without ``"type": "message"``; ``input_text``,
``output_text`` and ``refusal`` parts as text; ``input_image`` and
``input_file`` by data URI, file id or URL; a ``function_call_output``'s
output as a string or a list of parts. A reasoning item's summary parts are
joined with a blank line (a view sends them back as one part); its
``content`` (raw reasoning text, which the API does not take back) is not
kept. A reasoning item with neither summary text nor ``encrypted_content``
(what a reasoning model returns by default: only its ``rs_…`` id, a
reference to the reasoning the API stored) carries nothing to keep: it is
left out, and the items it led to lose their ids, as a view leaves them
when it cannot send their reasoning (the API refuses an item whose id pairs
with a reasoning item the input lacks). Other item types (built-in tool
calls, item references) are refused, naming the item.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from contextd_client.formats._fields import data_uri, require_object, require_string, text_or_parts
from contextd_client.v1 import content_pb2 as pb

_ROLES = {"system": pb.ROLE_SYSTEM, "developer": pb.ROLE_SYSTEM, "user": pb.ROLE_USER}
_ASSISTANT_SIDE = ("reasoning", "function_call")


def items_from_responses(input_items: str | Iterable[Mapping[str, Any]]) -> list[pb.Item]:
    """Convert Responses input items; raises ValueError naming the first bad field.

    A string is one user message, as the API reads it. A message that carries
    nothing (an empty user text) is skipped.
    """
    if isinstance(input_items, str):
        input_items = [{"role": "user", "content": input_items}]
    items: list[pb.Item] = []
    turn: pb.Item | None = None
    unpaired = False  # after a reasoning item left out: the items it led to go without their ids
    for i, given in enumerate(input_items):
        path = f"input[{i}]"
        entry = require_object(given, path)
        kind = entry.get("type", "message")
        if kind in _ASSISTANT_SIDE or (kind == "message" and entry.get("role") == "assistant"):
            if turn is None:
                turn, unpaired = pb.Item(role=pb.ROLE_ASSISTANT), False
                items.append(turn)
            blocks = _assistant_blocks(entry, kind, path)
            if kind == "reasoning":
                unpaired = not blocks and bool(entry.get("id"))
            elif unpaired:
                for block in blocks:
                    if block.HasField("tool_use"):
                        block.tool_use.item_id = ""
                    else:
                        block.text.item_id = ""
            turn.content.extend(blocks)
            continue
        turn = None
        if kind == "function_call_output":
            items.append(pb.Item(role=pb.ROLE_TOOL, content=[_output(entry, path)]))
        elif kind == "message":
            items.append(_message(entry, path))
        else:
            raise ValueError(f"{path}.type: unsupported item {kind!r} (message, function_call, ...)")
    return [item for item in items if item.content]


def _message(entry: Mapping[str, Any], path: str) -> pb.Item:
    role = entry.get("role")
    if role not in _ROLES:
        raise ValueError(f"{path}.role: unsupported role {role!r} (system, developer, user, assistant)")
    return pb.Item(role=_ROLES[role], content=_parts(entry.get("content"), f"{path}.content"))


def _assistant_blocks(entry: Mapping[str, Any], kind: str, path: str) -> list[pb.ContentBlock]:
    item_id = entry.get("id") or ""
    if not isinstance(item_id, str):
        raise ValueError(f"{path}.id: expected a string, not {type(item_id).__name__}")
    if kind == "function_call":
        arguments = entry.get("arguments") or "{}"  # some compatible servers send "" for no arguments
        if not isinstance(arguments, str):
            raise ValueError(f"{path}.arguments: expected a JSON string, not {type(arguments).__name__}")
        call = pb.ToolUseBlock(
            id=require_string(entry, "call_id", path),
            name=require_string(entry, "name", path),
            input_json=arguments,
            item_id=item_id,
        )
        return [pb.ContentBlock(tool_use=call)]
    if kind == "reasoning":
        summary = entry.get("summary") or []
        if not isinstance(summary, list):
            raise ValueError(f"{path}.summary: expected a list of summary parts")
        texts = [
            require_string(require_object(p, f"{path}.summary[{k}]"), "text", f"{path}.summary[{k}]")
            for k, p in enumerate(summary)
        ]
        encrypted = entry.get("encrypted_content") or ""
        if not isinstance(encrypted, str):
            raise ValueError(f"{path}.encrypted_content: expected a string")
        reasoning = pb.ReasoningBlock(text="\n\n".join(texts), item_id=item_id, encrypted_content=encrypted)
        return [pb.ContentBlock(reasoning=reasoning)] if reasoning.text or encrypted else []
    blocks = _parts(entry.get("content"), f"{path}.content")
    for block in blocks:
        if block.WhichOneof("block") != "text":
            raise ValueError(f"{path}.content: an assistant message carries text only")
        block.text.item_id = item_id
    return blocks


def _output(entry: Mapping[str, Any], path: str) -> pb.ContentBlock:
    call_id = require_string(entry, "call_id", path)
    output = entry.get("output")
    # An empty output is a real (empty) answer, not a missing one.
    parts = [] if output in ("", None) else _parts(output, f"{path}.output")
    return pb.ContentBlock(tool_result=pb.ToolResultBlock(tool_use_id=call_id, content=parts))


def _parts(content: Any, path: str) -> list[pb.ContentBlock]:
    return text_or_parts(content, path, _part)


def _part(part: Mapping[str, Any], path: str) -> pb.ContentBlock:
    kind = part.get("type")
    if kind in ("input_text", "output_text"):
        return pb.ContentBlock(text=pb.TextBlock(text=require_string(part, "text", path)))
    if kind == "refusal":
        return pb.ContentBlock(text=pb.TextBlock(text=require_string(part, "refusal", path)))
    if kind == "input_image":
        detail = part.get("detail") or ""
        image = pb.ImageBlock(detail="" if detail == "auto" else detail)
        if part.get("file_id"):
            image.uri = require_string(part, "file_id", path)
            return pb.ContentBlock(image=image)
        url = require_string(part, "image_url", path)
        decoded = data_uri(url, f"{path}.image_url")
        if decoded is None:
            image.uri = url
        else:
            image.media_type, image.data = decoded
        return pb.ContentBlock(image=image)
    if kind == "input_file":
        document = pb.DocumentBlock(title=part.get("filename") or "")
        if part.get("file_data"):
            decoded = data_uri(require_string(part, "file_data", path), f"{path}.file_data")
            if decoded is None:
                raise ValueError(f"{path}.file_data: expected a base64 data URI")
            document.media_type, document.data = decoded
        elif part.get("file_id"):
            document.uri = require_string(part, "file_id", path)
        elif part.get("file_url"):
            document.uri = require_string(part, "file_url", path)
        else:
            raise ValueError(f"{path}: an input_file needs file_data, file_id or file_url")
        return pb.ContentBlock(document=document)
    raise ValueError(f"{path}.type: unsupported content part {kind!r}")
