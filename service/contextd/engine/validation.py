"""Checks on an append batch. Nothing is written unless every item passes.

Two stages: `check_batch` needs only the batch and runs before any storage
work; `link_tool_results` needs the session's tool calls, so storage runs
it inside the append transaction, under the session lock.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from contextd.engine.errors import FieldViolation, InvalidArgument, LimitExceeded
from contextd.engine.model import (
    BLOCK_KINDS,
    Block,
    DocumentBlock,
    ImageBlock,
    ItemContent,
    ReasoningBlock,
    Role,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)

ALLOWED_BLOCKS: Mapping[Role, tuple[type, ...]] = {
    Role.SYSTEM: (TextBlock,),
    Role.USER: (TextBlock, ImageBlock, DocumentBlock),
    Role.ASSISTANT: (TextBlock, ToolUseBlock, ReasoningBlock),
    Role.TOOL: (ToolResultBlock,),
}


MAX_NAME_LENGTH = 256
"""Longest id, name, key or author, in characters (the history store keeps them in bounded columns)."""

MAX_ARGUMENT_DEPTH = 64
"""Deepest nesting of objects and arrays in tool arguments."""


def shown(value: str, limit: int = 60) -> str:
    """`value` quoted for an error message, cut short: messages travel in trailers."""
    return repr(value) if len(value) <= limit else repr(value[:limit]) + f"... ({len(value):,} characters)"


def check_name(field: str, value: str) -> list[FieldViolation]:
    """An id, name, key or author: bounded, and free of NUL (which no text column stores)."""
    if len(value) > MAX_NAME_LENGTH:
        return [FieldViolation(field, f"{len(value):,} characters, over the maximum of {MAX_NAME_LENGTH}")]
    if "\x00" in value:
        return [FieldViolation(field, "contains a NUL character")]
    return []


@dataclass(frozen=True, slots=True)
class Limits:
    max_batch_items: int
    max_item_bytes: int


def item_bytes(item: ItemContent) -> int:
    """Size of an item's payload in bytes: its text and binary data, UTF-8."""
    return sum(_block_bytes(b) for b in item.content)


def _block_bytes(block: Block) -> int:
    match block:
        case TextBlock(text, item_id):
            return len(text.encode()) + len(item_id.encode())
        case ToolUseBlock(id, name, input_json, item_id):
            return len(id.encode()) + len(name.encode()) + len(input_json.encode()) + len(item_id.encode())
        case ToolResultBlock(tool_use_id, content):
            return len(tool_use_id.encode()) + sum(_block_bytes(p) for p in content)
        case ImageBlock(_, data, uri):
            return len(data or b"") + len((uri or "").encode())
        case DocumentBlock(_, data, uri, text):
            return len(data or b"") + len((uri or "").encode()) + len((text or "").encode())
        case ReasoningBlock(text, signature, redacted, item_id, encrypted):
            return sum(len(field.encode()) for field in (text, signature, redacted, item_id, encrypted))
    raise TypeError(f"not a content block: {block!r}")


def check_batch_size(count: int, limits: Limits) -> None:
    """The batch's size alone: checked before anything is made of its items."""
    if not count:
        raise InvalidArgument.at("items", "the batch is empty: append at least one item")
    if count > limits.max_batch_items:
        raise LimitExceeded.at(
            "items", f"{count:,} items, over the limit of {limits.max_batch_items:,} per append (max_batch_items)"
        )


def check_batch(items: Sequence[ItemContent], limits: Limits) -> None:
    """Raise InvalidArgument naming every bad field of the batch."""
    check_batch_size(len(items), limits)
    violations: list[FieldViolation] = []
    tool_use_ids: set[str] = set()
    for i, item in enumerate(items):
        path = f"items[{i}]"
        size = item_bytes(item)
        if size > limits.max_item_bytes:
            raise LimitExceeded.at(
                path, f"{size:,} bytes, over the limit of {limits.max_item_bytes:,} bytes per item (max_item_bytes)"
            )
        violations.extend(_check_item_fields(item, path))
        if not item.content:
            violations.append(FieldViolation(f"{path}.content", "an item needs at least one content block"))
        if item.role is Role.TOOL and len(item.content) != 1:
            violations.append(FieldViolation(f"{path}.content", "a tool item holds exactly one tool_result block"))
        for j, block in enumerate(item.content):
            violations.extend(_check_block(block, item.role, f"{path}.content[{j}]"))
            if isinstance(block, ToolUseBlock) and block.id:
                if block.id in tool_use_ids:
                    violations.append(
                        FieldViolation(f"{path}.content[{j}].tool_use.id", f"tool_use id {shown(block.id)} repeats")
                    )
                tool_use_ids.add(block.id)
    if violations:
        raise InvalidArgument(violations)


def _check_item_fields(item: ItemContent, path: str) -> list[FieldViolation]:
    found = check_name(f"{path}.name", item.name)
    if item.tool_effect is not None:
        found += check_name(f"{path}.tool_effect.source_arg", item.tool_effect.source_arg)
    if item.source is not None:
        for name, value in (("uri", item.source.uri), ("version", item.source.version)):
            if "\x00" in value:
                found.append(FieldViolation(f"{path}.source.{name}", "contains a NUL character"))
    return found


def _check_block(block: Block, role: Role, path: str) -> list[FieldViolation]:
    kind = BLOCK_KINDS[type(block)]
    if not isinstance(block, ALLOWED_BLOCKS[role]):
        allowed = ", ".join(BLOCK_KINDS[t] for t in ALLOWED_BLOCKS[role])
        return [FieldViolation(path, f"{_a(role.value)} item cannot hold {_a(kind)} block (allowed: {allowed})")]
    at = f"{path}.{kind}"
    match block:
        case TextBlock(text):
            return [] if text else [FieldViolation(f"{at}.text", "text is empty")]
        case ToolUseBlock():
            return _check_tool_use(block, at)
        case ToolResultBlock(tool_use_id, content, _, name):
            found = check_name(f"{at}.tool_use_id", tool_use_id) + check_name(f"{at}.name", name)
            if not tool_use_id:
                found.append(FieldViolation(f"{at}.tool_use_id", "tool_use_id is empty"))
            for k, part in enumerate(content):
                if not isinstance(part, TextBlock | ImageBlock | DocumentBlock):
                    found.append(
                        FieldViolation(f"{at}.content[{k}]", "a tool result holds text, image or document blocks")
                    )
                elif not isinstance(part, TextBlock):  # empty text is a valid (empty) output
                    found.extend(_check_block(part, Role.USER, f"{at}.content[{k}]"))
            return found
        case ImageBlock(media_type, data, uri):
            if not data and not uri:  # empty bytes would render an image no provider accepts
                return [FieldViolation(f"{at}", "an image needs data or a uri")]
            if data is not None and not media_type.startswith("image/"):
                return [FieldViolation(f"{at}.media_type", f"{shown(media_type)} is not an image media type")]
            return []
        case DocumentBlock(media_type, data, uri, text):
            if not data and not uri and text is None:  # empty bytes: as for images
                return [FieldViolation(f"{at}", "a document needs data, a uri or text")]
            if data is not None and not media_type:
                return [FieldViolation(f"{at}.media_type", "media_type is required with data")]
            return []
        case ReasoningBlock(text, _, redacted, _, encrypted):
            if text or redacted or encrypted:
                return []
            return [FieldViolation(at, "reasoning needs text, redacted_data or encrypted_content")]
    return []


def _a(word: str) -> str:
    # Of the role and block names, these two take "an" ("a user", "an image").
    return f"{'an' if word in ('assistant', 'image') else 'a'} {word}"


def _check_tool_use(block: ToolUseBlock, at: str) -> list[FieldViolation]:
    found = check_name(f"{at}.id", block.id) + check_name(f"{at}.name", block.name)
    if not block.id:
        found.append(FieldViolation(f"{at}.id", "id is empty"))
    if not block.name:
        found.append(FieldViolation(f"{at}.name", "name is empty"))
    try:
        arguments = _parse_arguments(block.input_json)
    except ValueError as exc:
        found.append(FieldViolation(f"{at}.input_json", f"not valid JSON: {exc}"))
    else:
        if not isinstance(arguments, dict):
            found.append(FieldViolation(f"{at}.input_json", f"must be a JSON object, not {type(arguments).__name__}"))
    return found


def load_json(text: str, max_depth: int = MAX_ARGUMENT_DEPTH) -> Any:
    """`text` parsed as JSON, strictly (no NaN or Infinity, no number JSON cannot write
    back) and at most `max_depth` levels deep; ValueError saying what is wrong otherwise."""
    try:
        value = json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
    except RecursionError:  # deeper than the parser goes: far past any limit
        raise ValueError(f"nested deeper than {max_depth} levels") from None
    if _depth(value) > max_depth:
        raise ValueError(f"nested deeper than {max_depth} levels")
    return value


def _parse_arguments(input_json: str) -> object:
    """The arguments as the Anthropic renderer parses and re-serializes them.

    Checked here because history is append-only: text accepted now that a
    view cannot carry would break every later render of the session.
    """
    value = load_json(input_json)
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        # An escaped lone surrogate ("\ud800") parses, but no UTF-8 view can carry it.
        raise ValueError("a \\u escape encodes a lone surrogate, which UTF-8 cannot carry") from None
    return value


def _finite_float(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):  # 1e400 parses to inf, which JSON cannot write back
        raise ValueError(f"{shown(text)} is too large for a JSON number")
    return number


def _depth(value: object) -> int:
    """Nesting depth of a parsed JSON value, without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, level = stack.pop()
        if isinstance(node, dict | list):
            deepest = max(deepest, level)
            stack.extend((child, level + 1) for child in (node.values() if isinstance(node, dict) else node))
    return deepest


def _reject_constant(name: str) -> object:
    # Python's json accepts NaN and Infinity; JSON does not, and a view must be JSON.
    raise ValueError(f"{name} is not a JSON value")


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A tool_use already in the session."""

    name: str
    answered: bool


def link_tool_results(
    items: Sequence[ItemContent], known: Mapping[str, ToolCall]
) -> tuple[list[ItemContent], list[FieldViolation]]:
    """Match each tool_result to its tool_use and fill in the tool's name.

    `known` holds the session's tool calls whose ids the batch mentions.
    Returns the items (tool results carrying the tool name) and the
    violations: a tool_use id reused, a result without its call, a call
    answered twice, a name that contradicts the call's.
    """
    calls = dict(known)
    linked: list[ItemContent] = []
    violations: list[FieldViolation] = []
    for i, item in enumerate(items):
        for j, block in enumerate(item.content):
            if not isinstance(block, ToolUseBlock):
                continue
            if block.id in calls:
                violations.append(
                    FieldViolation(
                        f"items[{i}].content[{j}].tool_use.id",
                        f"tool_use id {shown(block.id)} is already used in this session",
                    )
                )
            calls[block.id] = ToolCall(block.name, answered=False)
        result = item.tool_result
        if result is None:
            linked.append(item)
            continue
        at = f"items[{i}].content[0].tool_result"
        call = calls.get(result.tool_use_id)
        if call is None:
            violations.append(
                FieldViolation(f"{at}.tool_use_id", f"no earlier tool_use has id {shown(result.tool_use_id)}")
            )
        elif call.answered:
            violations.append(
                FieldViolation(f"{at}.tool_use_id", f"tool_use {shown(result.tool_use_id)} already has a result")
            )
        elif result.name and result.name != call.name:
            violations.append(
                FieldViolation(f"{at}.name", f"{shown(result.name)} does not match the call's tool {call.name!r}")
            )
        else:
            calls[result.tool_use_id] = ToolCall(call.name, answered=True)
            item = replace(item, content=(replace(result, name=call.name),))
        linked.append(item)
    return linked, violations
