"""Reading provider dicts: malformed input is a ValueError naming the field,
never a KeyError, AttributeError or TypeError from deep inside."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Mapping
from typing import Any

from contextd_client.v1 import content_pb2 as pb


def require_object(value: Any, path: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ValueError(f"{path}: expected an object, not {type(value).__name__}")
    return value


def require_string(obj: Mapping[str, Any], key: str, path: str) -> str:
    """The required string field `key` of `obj`."""
    value = obj.get(key)
    if value is None:
        raise ValueError(f"{path}.{key}: missing")
    if not isinstance(value, str):
        raise ValueError(f"{path}.{key}: expected a string, not {type(value).__name__}")
    return value


def decode_base64(data: str, path: str) -> bytes:
    try:
        return base64.b64decode(data, validate=True)
    except binascii.Error as exc:
        raise ValueError(f"{path}: bad base64 ({exc})") from None


def data_uri(url: str, path: str) -> tuple[str, bytes] | None:
    """(media type, bytes) of a base64 data URI; None for any other URL."""
    if not url.startswith("data:"):
        return None
    header, sep, payload = url[5:].partition(",")
    media_type, *parameters = header.split(";")
    if not sep or not parameters or parameters[-1] != "base64":
        raise ValueError(f"{path}: only base64 data URIs are supported")
    return media_type, decode_base64(payload, path)


def text_or_parts(
    content: Any, path: str, read_part: Callable[[Mapping[str, Any], str], pb.ContentBlock]
) -> list[pb.ContentBlock]:
    """An OpenAI content field: none (empty), a string (one text block) or a list of parts,
    each read by `read_part`."""
    if content is None or content == "":
        return []
    if isinstance(content, str):
        return [pb.ContentBlock(text=pb.TextBlock(text=content))]
    if not isinstance(content, list):
        raise ValueError(f"{path}: expected a string or a list of parts, not {type(content).__name__}")
    return [read_part(require_object(part, f"{path}[{k}]"), f"{path}[{k}]") for k, part in enumerate(content)]


def split_user(blocks: list[pb.ContentBlock]) -> list[pb.Item]:
    """A user turn's blocks as items: each tool result its own tool item, each run of other
    blocks a user item, in order (the unit a view keeps or prunes is the tool result)."""
    items: list[pb.Item] = []
    run: list[pb.ContentBlock] = []
    for block in blocks:
        if block.WhichOneof("block") == "tool_result":
            if run:
                items.append(pb.Item(role=pb.ROLE_USER, content=run))
                run = []
            items.append(pb.Item(role=pb.ROLE_TOOL, content=[block]))
        else:
            run.append(block)
    if run:
        items.append(pb.Item(role=pb.ROLE_USER, content=run))
    return items
