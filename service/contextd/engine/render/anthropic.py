"""Items to Anthropic Messages ``system`` and ``messages``.

Leading system items become the top-level ``system``. The Messages API
wants user and assistant turns to alternate and carries tool results as
blocks of a user turn, so consecutive user-side items (user, tool, and any
later system item) merge into one user message, and consecutive assistant
items into one assistant message. A message made from a single one-text
item keeps a plain string content, so text round-trips byte for byte; such
a message is never merged into afterwards (a following same-role item
starts a new message, which the API combines), so rendering is append-
stable: the view of a longer history starts with the view of a shorter one.

A view whose caller lets it place the prompt-cache breakpoint carries one
``cache_control`` mark (`mark_breakpoint`), added to the final JSON only: the
messages a later render compares and resumes are the unmarked ones, as the
provider's cache matches content, not marks.
"""

from __future__ import annotations

import json
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from functools import partial

from contextd.engine.codec import b64_text
from contextd.engine.memo import IdentityMemo
from contextd.engine.model import (
    Block,
    DocumentBlock,
    ImageBlock,
    ReasoningBlock,
    Role,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from contextd.engine.render.base import JsonObject, Notes, Renderable, Rendered, render_all, sources, to_json


@dataclass(frozen=True, slots=True)
class _Blocks:
    """One item's blocks in the Messages format, with what the format could not carry."""

    blocks: tuple[JsonObject, ...]
    notes: Notes


_converted: IdentityMemo[_Blocks] = IdentityMemo(200_000)


def _convert(item: Renderable) -> _Blocks:
    notes = Rendered()
    blocks = tuple(_block(b) for b in item.content if _carried(b, item.seq, notes))
    return _Blocks(blocks, Notes.of(notes))


def render_anthropic(items: Sequence[Renderable]) -> Rendered:
    return render_all(AnthropicFolder(), items)


class AnthropicFolder:
    """Merges consecutive same-side items into one message; a message is final once
    the next one opens (or at `finish`)."""

    def __init__(self, out: Rendered | None = None) -> None:
        self.out = out if out is not None else Rendered()
        self.system: tuple[JsonObject, ...] = ()
        self.leading = True
        self.unanswered: frozenset[str] = frozenset()
        """tool_use ids whose results have not been rendered yet."""

    def state(self) -> Hashable:
        return self.leading, self.system, self.unanswered

    def resume(self, state: Hashable) -> None:
        self.leading, self.system, self.unanswered = state  # type: ignore[misc]

    def feed(self, item: Renderable) -> bool:
        out = self.out
        if item.role is Role.SYSTEM and self.leading:
            self.system = (*self.system, *(_block(b) for b in item.content))
            out.message_index[item.seq] = -1
            return False
        self.leading = False
        if item.role is Role.SYSTEM:
            out.warn(
                "SYSTEM_AS_USER",
                f"seq {item.seq}: the Messages API takes system text only before the first turn; sent as user text",
            )
        role = "assistant" if item.role is Role.ASSISTANT else "user"
        converted = _converted.get(sources(item), lambda: _convert(item))
        out.take(converted.notes)
        blocks = list(converted.blocks)  # a message's list is its own: merging extends it
        if not blocks:
            out.message_index[item.seq] = -1
            out.omitted.add(item.seq)
            return False
        calls = {b["id"] for b in blocks if b["type"] == "tool_use"}
        answers = {b["tool_use_id"] for b in blocks if b["type"] == "tool_result"}
        if calls or (answers and self.unanswered):
            self.unanswered = (self.unanswered | calls) - answers
        # Text that arrives while calls await their results must stay open to
        # them (a list), so the results can merge in and come first.
        return _append(out, item.seq, role, blocks, open_list=role == "user" and bool(self.unanswered))

    def finish(self) -> None:
        out = self.out
        out.system = _system(self.system)
        for message in out.messages[len(out.messages_json) :]:
            if message["role"] == "user" and isinstance(message["content"], list):
                # The API wants a turn's tool results before anything else in it;
                # a stable sort keeps each group in history order.
                message["content"].sort(key=lambda block: block["type"] != "tool_result")
            out.add_json((_message_json(message),))


CACHE_CONTROL: JsonObject = {"type": "ephemeral"}
_UNMARKABLE = ("thinking", "redacted_thinking")  # the API takes no cache_control on these


def mark_breakpoint(
    rendered: Rendered, through: Renderable | None = None, shared: bool = False
) -> tuple[Sequence[str], str] | None:
    """The messages (each as JSON) and system JSON of `rendered` (final) with a cache breakpoint after item
    `through` (None: at the end of the view); None when it cannot be put there exactly.
    `shared`: items after `through` are in its message too, whose blocks the format may have
    reordered (tool results first): then only a run of tool results, kept in order, is marked
    between items."""
    messages, system = rendered.messages, rendered.system
    index = rendered.message_index.get(through.seq, -1) if through is not None else len(messages) - 1
    if through is not None and index < 0 and (through.role is not Role.SYSTEM or through.seq in rendered.omitted):
        return None  # left out of the view
    if index < 0:  # the system field
        blocks: list[JsonObject] = [{"type": "text", "text": system}] if isinstance(system, str) else list(system or ())
        at = _last_of(blocks)
        if at is None:
            return None
        blocks[at] = {**blocks[at], "cache_control": CACHE_CONTROL}
        return rendered.json_blocks.blocks(rendered.messages_json), to_json(blocks)
    content = messages[index]["content"]
    blocks = [{"type": "text", "text": content}] if isinstance(content, str) else list(content)
    own = None
    if shared and through is not None:
        if any(block["type"] != "tool_result" for block in blocks):
            return None
        own = _converted.get(sources(through), lambda: _convert(through)).blocks
    at = _last_of(blocks, own)
    if at is None:
        return None
    blocks[at] = {**blocks[at], "cache_control": CACHE_CONTROL}
    marked = rendered.json_blocks.blocks(rendered.messages_json)
    marked = marked.replaced(index, to_json({"role": messages[index]["role"], "content": blocks}))
    return marked, to_json(system) if system is not None else ""


def _last_of(content: Sequence[JsonObject], own: Sequence[JsonObject] | None = None) -> int | None:
    """The index of the last block in `content` that can carry a mark (not reasoning, not an
    empty text) and is one of `own` (None: any)."""
    for at in range(len(content) - 1, -1, -1):
        block = content[at]
        empty = block["type"] == "text" and not block["text"]
        if block["type"] not in _UNMARKABLE and not empty and (own is None or block in own):
            return at
    return None


def _message_json(message: JsonObject) -> str:
    """`to_json(message)`, made of its blocks' JSON: the blocks are the items' own
    (remembered), while messages are made anew on every render."""
    content = message["content"]
    if isinstance(content, str):  # a lone text: the item's own string
        body = _block_json.get((content,), partial(to_json, content))
    else:
        body = "[" + ",".join(_block_json.get((b,), partial(to_json, b)) for b in content) + "]"
    return _OPENINGS[message["role"]] + body + "}"


_block_json: IdentityMemo[str] = IdentityMemo(400_000)
_OPENINGS = {role: '{"role":' + to_json(role) + ',"content":' for role in ("user", "assistant")}


def _carried(block: Block, seq: int, out: Rendered) -> bool:
    """Whether the Messages API accepts `block`; when not, say so in the view."""
    if isinstance(block, ReasoningBlock) and not block.signature and not block.redacted_data:
        message = f"seq {seq}: unsigned reasoning (from another provider) cannot be sent back"
        out.drop(seq, [block], "REASONING_DROPPED", message)
        return False
    if isinstance(block, DocumentBlock) and block.uri is not None and "://" not in block.uri:
        out.drop(seq, [block], "DOCUMENT_DROPPED", f"seq {seq}: {block.uri!r} is another provider's file id, not a URL")
        return False
    return True


def _append(out: Rendered, seq: int, role: str, blocks: list[JsonObject], open_list: bool = False) -> bool:
    """Add an item's blocks to the last message or a new one; True when it opened one."""
    last = out.messages[-1] if out.messages else None
    opened = False
    if last is not None and last["role"] == role and isinstance(last["content"], list):
        last["content"].extend(blocks)
    else:
        opened = True
        # A message whose content is a plain string is never rewritten into a
        # list: that would change bytes an earlier render already sent (and the
        # provider cached). The API combines consecutive same-role messages.
        lone_text = len(blocks) == 1 and blocks[0]["type"] == "text" and not open_list
        out.messages.append({"role": role, "content": blocks[0]["text"] if lone_text else blocks})
    out.message_index[seq] = len(out.messages) - 1
    return opened


def _system(blocks: tuple[JsonObject, ...]) -> str | list[JsonObject] | None:
    if not blocks:
        return None
    if len(blocks) == 1:
        text: str = blocks[0]["text"]
        return text
    return list(blocks)


def _block(block: Block) -> JsonObject:
    match block:
        case TextBlock(text):
            return {"type": "text", "text": text}
        case ToolUseBlock(id, name, input_json):
            return {"type": "tool_use", "id": id, "name": name, "input": json.loads(input_json)}
        case ToolResultBlock(tool_use_id, content, is_error):
            result: JsonObject = {"type": "tool_result", "tool_use_id": tool_use_id}
            if len(content) == 1 and isinstance(content[0], TextBlock):
                result["content"] = content[0].text
            elif content:
                result["content"] = [_block(p) for p in content]
            if is_error:
                result["is_error"] = True
            return result
        case ImageBlock(media_type, data, uri):
            if data is not None:
                return {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": b64_text(data)}}
            return {"type": "image", "source": {"type": "url", "url": uri}}
        case DocumentBlock(media_type, data, uri, text, title):
            if data is not None:
                source: JsonObject = {"type": "base64", "media_type": media_type, "data": b64_text(data)}
            elif text is not None:
                source = {"type": "text", "media_type": media_type or "text/plain", "data": text}
            else:
                source = {"type": "url", "url": uri}
            document: JsonObject = {"type": "document", "source": source}
            if title:
                document["title"] = title
            return document
        case ReasoningBlock(text, signature, redacted_data):
            if redacted_data:
                return {"type": "redacted_thinking", "data": redacted_data}
            return {"type": "thinking", "thinking": text, "signature": signature}
    raise TypeError(f"not a content block: {block!r}")
