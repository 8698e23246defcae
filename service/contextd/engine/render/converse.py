"""Items to Amazon Bedrock Converse ``system`` and ``messages``.

Leading system items become the top-level ``system``: a list of text
blocks. Converse wants user and assistant messages to alternate and carries
tool results as blocks of a user message, so consecutive user-side items
(user, tool, and any later system item, sent as user text with a
``SYSTEM_AS_USER`` warning) always merge into one user message, and
consecutive assistant items into one assistant message; content is always a
list. Within a user message the tool results come first. A message is final
once the next one opens, so rendering is append-stable up to the last
message (which a later item of its side may still extend).

Blocks: text ``{"text"}``; a call ``{"toolUse"}`` (its arguments as an
object); a result ``{"toolResult"}`` whose ``status`` is written only for an
error (success is the default, and some models take no status at all).
Bytes (images, documents, redacted reasoning) travel in the view's JSON as
base64 text, as Bedrock's HTTP API carries them; the client's
``View.converse_kwargs`` turns them back into the bytes boto3 expects.

What Converse refuses is left out, with a warning: text with no visible
character (``BLANK_TEXT_DROPPED``; within a tool result it is left out
silently), images that are neither bytes in png/jpeg/gif/webp nor in S3
(``IMAGE_DROPPED``), documents of another format or by another URL
(``DOCUMENT_DROPPED``), reasoning without a signature or redacted
data (``REASONING_DROPPED``), participant names (``NAME_DROPPED``). A tool
result left with no content is sent as ``[{"text": "(no output)"}]``: Converse
needs one block and refuses empty text. A document's ``name`` is its title with
every character Converse refuses (all but ASCII letters and digits, single
spaces, hyphens, parentheses and brackets) turned into a space, or
``document``; names repeat nowhere in a request (case aside), so a repeat gets
`` (2)``, `` (3)``... A user message with a document and no text gets
``(document attached)``: Converse wants text beside a document. A view
whose first message would be the assistant's (what opened the conversation
was left out) opens with a user message ``(earlier messages left out)``.

Not done: prompt-cache ``cachePoint`` marks (the view places none), and the
API's counts (at most five documents and twenty images).
"""

from __future__ import annotations

import base64
import binascii
import json
import re
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

IMAGE_FORMATS = {
    "image/png": "png",
    "image/jpeg": "jpeg",
    "image/jpg": "jpeg",
    "image/gif": "gif",
    "image/webp": "webp",
}
DOCUMENT_FORMATS = {
    "application/pdf": "pdf",
    "text/csv": "csv",
    "application/msword": "doc",
    "application/vnd.openxmlformats-officedocument.wordprocessingml.document": "docx",
    "application/vnd.ms-excel": "xls",
    "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet": "xlsx",
    "text/html": "html",
    "text/plain": "txt",
    "text/markdown": "md",
}
_DOCUMENT_KINDS = tuple(dict.fromkeys(DOCUMENT_FORMATS.values()))
_TEXT_FORMATS = ("txt", "md", "html", "csv")
NO_OUTPUT = "(no output)"
"""A tool result's content when it has none Converse takes."""
DOCUMENT_NOTE: JsonObject = {"text": "(document attached)"}
"""The text a user message with a document and no text gets."""
OPENING: JsonObject = {"text": "(earlier messages left out)"}
"""The user message a view opens with when what opened the conversation was left out."""
MAX_NAME = 200
"""Characters in a document name."""
_UNSAFE = re.compile(r"[^A-Za-z0-9\-()\[\] ]")


@dataclass(frozen=True, slots=True)
class _Blocks:
    """One item's blocks in the Converse format, with what the format could not carry."""

    blocks: tuple[JsonObject, ...]
    notes: Notes
    documents: bool
    """Whether a block is or holds a document (whose name must not repeat in the request)."""


_converted: IdentityMemo[_Blocks] = IdentityMemo(200_000)


def _convert(item: Renderable) -> _Blocks:
    notes = Rendered()
    blocks = tuple(b for b in (_block(item.seq, block, notes) for block in item.content) if b is not None)
    if blocks and item.name:
        notes.warn("NAME_DROPPED", f"seq {item.seq}: Converse messages carry no participant name; left out")
    return _Blocks(blocks, Notes.of(notes), any(_documents_in(b) for b in blocks))


def render_converse(items: Sequence[Renderable]) -> Rendered:
    return render_all(ConverseFolder(), items)


class ConverseFolder:
    """Merges consecutive same-side items into one message; a message is final once
    the next one opens (or at `finish`)."""

    def __init__(self, out: Rendered | None = None) -> None:
        self.out = out if out is not None else Rendered()
        self.leading = True
        self.system: tuple[str, ...] = ()
        """The texts of the leading system items."""
        self.names: frozenset[str] = frozenset()
        """The document names in the view so far, casefolded."""

    def state(self) -> Hashable:
        return self.leading, self.system, self.names

    def resume(self, state: Hashable) -> None:
        self.leading, self.system, self.names = state  # type: ignore[misc]

    def feed(self, item: Renderable) -> bool:
        out = self.out
        converted = _converted.get(sources(item), lambda: _convert(item))
        leading = item.role is Role.SYSTEM and self.leading
        if not leading:
            self.leading = False
            if item.role is Role.SYSTEM:
                out.warn(
                    "SYSTEM_AS_USER",
                    f"seq {item.seq}: Converse takes system text only before the first message; sent as user text",
                )
        out.take(converted.notes)
        if not converted.blocks:
            out.message_index[item.seq] = -1
            out.omitted.add(item.seq)
            return False
        if leading:
            self.system = (*self.system, *(b["text"] for b in converted.blocks))
            out.message_index[item.seq] = -1
            return False
        blocks = list(converted.blocks)  # a message's list is its own: merging extends it
        if converted.documents:
            blocks = [self._named(b) for b in blocks]
        role = "assistant" if item.role is Role.ASSISTANT else "user"
        last = out.messages[-1] if out.messages else None
        opened = last is None or last["role"] != role
        if last is not None and not opened:
            last["content"].extend(blocks)
        else:
            if last is None and role == "assistant":
                # Converse wants the user first; what opened the conversation was left out.
                out.messages.append({"role": "user", "content": [OPENING]})
            out.messages.append({"role": role, "content": blocks})
        out.message_index[item.seq] = len(out.messages) - 1
        return opened

    def finish(self) -> None:
        out = self.out
        out.system = [{"text": text} for text in self.system] if self.system else None
        for message in out.messages[len(out.messages_json) :]:
            content = message["content"]
            if message["role"] == "user":
                # Converse wants a message's tool results before anything else in it;
                # a stable sort keeps each group in history order.
                content.sort(key=lambda block: "toolResult" not in block)
                if any("document" in b for b in content) and not any("text" in b for b in content):
                    content.append(DOCUMENT_NOTE)
            out.add_json((_message_json(message),))

    def _named(self, block: JsonObject) -> JsonObject:
        """`block` with each document in it named apart from every document before it
        (`block` itself when no name changes: its JSON is remembered)."""
        if "document" in block:
            document = self._unique(block["document"])
            return block if document is block["document"] else {"document": document}
        if "toolResult" in block:
            result = block["toolResult"]
            content = [self._named(part) for part in result["content"]]
            if any(new is not old for new, old in zip(content, result["content"], strict=True)):
                return {"toolResult": {**result, "content": content}}
        return block

    def _unique(self, document: JsonObject) -> JsonObject:
        base: str = document["name"]
        name, n = base, 1
        while name.casefold() in self.names:
            n += 1
            suffix = f" ({n})"
            name = base[: MAX_NAME - len(suffix)].rstrip() + suffix
        self.names = self.names | {name.casefold()}
        return document if name == base else {**document, "name": name}


def _documents_in(block: JsonObject) -> bool:
    if "document" in block:
        return True
    return "toolResult" in block and any("document" in p for p in block["toolResult"]["content"])


def _message_json(message: JsonObject) -> str:
    """`to_json(message)`, made of its blocks' JSON: the blocks are the items' own
    (remembered), while messages are made anew on every render."""
    body = ",".join(_block_json.get((b,), partial(to_json, b)) for b in message["content"])
    return _OPENINGS[message["role"]] + body + "]}"


_block_json: IdentityMemo[str] = IdentityMemo(400_000)
_OPENINGS = {role: '{"role":' + to_json(role) + ',"content":[' for role in ("user", "assistant")}


def _block(seq: int, block: Block, out: Rendered) -> JsonObject | None:
    """`block` in the Converse format; None when Converse cannot take it (`out` hears why)."""
    match block:
        case TextBlock(text):
            if text.strip():
                return {"text": text}
            out.drop(
                seq, [block], "BLANK_TEXT_DROPPED", f"seq {seq}: Converse refuses text without a visible character"
            )
            return None
        case ToolUseBlock(id, name, input_json):
            return {"toolUse": {"toolUseId": id, "name": name, "input": json.loads(input_json)}}
        case ToolResultBlock():
            return _result(seq, block, out)
        case ImageBlock():
            return _image(seq, block, out)
        case DocumentBlock():
            return _document(seq, block, out)
        case ReasoningBlock():
            return _reasoning(seq, block, out)
    raise TypeError(f"not a content block: {block!r}")


def _result(seq: int, result: ToolResultBlock, out: Rendered) -> JsonObject:
    parts: list[JsonObject] = []
    for part in result.content:
        if isinstance(part, TextBlock):
            if part.text.strip():  # a blank output says nothing; Converse refuses it
                parts.append({"text": part.text})
            continue
        converted = _image(seq, part, out) if isinstance(part, ImageBlock) else _document(seq, part, out)
        if converted is not None:
            parts.append(converted)
    body: JsonObject = {"toolUseId": result.tool_use_id, "content": parts or [{"text": NO_OUTPUT}]}
    if result.is_error:
        body["status"] = "error"
    return {"toolResult": body}


def _image(seq: int, image: ImageBlock, out: Rendered) -> JsonObject | None:
    if image.data:
        source: JsonObject = {"bytes": b64_text(image.data)}
    elif _in_s3(image.uri):
        source = {"s3Location": {"uri": image.uri}}
    else:
        out.drop(
            seq, [image], "IMAGE_DROPPED", f"seq {seq}: Converse takes images as bytes or from S3, not {image.uri!r}"
        )
        return None
    fmt = _format(image.media_type, image.uri, IMAGE_FORMATS)
    if not fmt:
        why = f"Converse takes png, jpeg, gif and webp images, not {image.media_type or image.uri!r}"
        out.drop(seq, [image], "IMAGE_DROPPED", f"seq {seq}: {why}")
        return None
    return {"image": {"format": fmt, "source": source}}


def _document(seq: int, document: DocumentBlock, out: Rendered) -> JsonObject | None:
    fmt = _format(document.media_type, document.uri, DOCUMENT_FORMATS)
    if document.data:
        source: JsonObject = {"bytes": b64_text(document.data)}
    elif document.text is not None and document.text.strip():
        fmt = fmt if fmt in _TEXT_FORMATS else "txt"
        source = {"text": document.text}
    elif _in_s3(document.uri):
        source = {"s3Location": {"uri": document.uri}}
    else:
        what = "an empty text" if document.text is not None else repr(document.uri)
        why = f"Converse takes documents as bytes, text or from S3, not {what}"
        out.drop(seq, [document], "DOCUMENT_DROPPED", f"seq {seq}: {why}")
        return None
    if not fmt:
        why = f"Converse takes {', '.join(_DOCUMENT_KINDS)} documents, not {document.media_type or document.uri!r}"
        out.drop(seq, [document], "DOCUMENT_DROPPED", f"seq {seq}: {why}")
        return None
    return {"document": {"format": fmt, "name": document_name(document.title), "source": source}}


def document_name(title: str) -> str:
    """A name Converse takes for a document titled `title` (before it is told apart from others)."""
    return " ".join(_UNSAFE.sub(" ", title).split())[:MAX_NAME].rstrip() or "document"


def _reasoning(seq: int, reasoning: ReasoningBlock, out: Rendered) -> JsonObject | None:
    if reasoning.redacted_data:
        try:
            base64.b64decode(reasoning.redacted_data, validate=True)
        except binascii.Error:
            why = "redacted reasoning that is not base64 cannot be sent as Converse bytes"
        else:
            return {"reasoningContent": {"redactedContent": reasoning.redacted_data}}
    elif reasoning.signature:
        return {"reasoningContent": {"reasoningText": {"text": reasoning.text, "signature": reasoning.signature}}}
    else:
        why = "unsigned reasoning (from another provider) cannot be sent back"
    out.drop(seq, [reasoning], "REASONING_DROPPED", f"seq {seq}: {why}")
    return None


def _format(media_type: str, uri: str | None, formats: dict[str, str]) -> str:
    """The Converse format of a media type (without one, of the uri's extension); "" when Converse has none."""
    if media_type or not uri:
        return formats.get(media_type.split(";")[0].strip().lower(), "")
    extension = uri.rsplit("/", 1)[-1].rpartition(".")[2].lower()
    extension = "jpeg" if extension == "jpg" else extension
    return extension if extension in formats.values() else ""


def _in_s3(uri: str | None) -> bool:
    return uri is not None and uri.startswith("s3://")
