"""Items to OpenAI Chat Completions ``messages``.

One item gives one message. A single text block renders as a string
content, several blocks as a list of parts, so text round-trips byte for
byte. What Chat Completions cannot carry (reasoning, a tool result's error
flag, images inside tool results, documents by URL) is left out with a
warning in the view.
"""

from __future__ import annotations

from collections.abc import Sequence

from contextd.engine.memo import IdentityMemo
from contextd.engine.model import (
    DocumentBlock,
    ImageBlock,
    ReasoningBlock,
    Role,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from contextd.engine.render.base import (
    ItemwiseFolder,
    JsonObject,
    Notes,
    Piece,
    Renderable,
    Rendered,
    data_uri,
    render_all,
    to_json,
)

_pieces: IdentityMemo[Piece] = IdentityMemo(200_000)


def render_openai(items: Sequence[Renderable]) -> Rendered:
    return render_all(OpenAIFolder(), items)


class OpenAIFolder(ItemwiseFolder):
    """One message per item, final as soon as it is made."""

    def __init__(self, out: Rendered | None = None) -> None:
        super().__init__(_piece, _pieces, out)


def _piece(item: Renderable) -> Piece:
    notes = Rendered()
    message = _message(item, notes)
    if message is not None and item.name and item.role is not Role.TOOL:
        message["name"] = item.name
    if message is None:
        return Piece((), (), Notes.of(notes))
    return Piece((message,), (to_json(message),), Notes.of(notes))


def _message(item: Renderable, out: Rendered) -> JsonObject | None:
    if item.role is Role.TOOL:
        result = item.tool_result
        assert result is not None  # validated at append
        return {"role": "tool", "tool_call_id": result.tool_use_id, "content": _tool_content(item.seq, result, out)}
    if item.role is Role.ASSISTANT:
        return _assistant(item, out)
    parts = [p for p in (_part(item.seq, b, out) for b in item.content) if p is not None]
    return {"role": item.role.value, "content": _content(parts)} if parts else None


def _assistant(item: Renderable, out: Rendered) -> JsonObject | None:
    texts = [{"type": "text", "text": b.text} for b in item.content if isinstance(b, TextBlock)]
    calls = [
        {"id": b.id, "type": "function", "function": {"name": b.name, "arguments": b.input_json}}
        for b in item.content
        if isinstance(b, ToolUseBlock)
    ]
    reasoning = [b for b in item.content if isinstance(b, ReasoningBlock)]
    if reasoning:
        out.drop(
            item.seq,
            reasoning,
            "REASONING_DROPPED",
            f"seq {item.seq}: Chat Completions has no field for reasoning; left out",
        )
    if not texts and not calls:
        return None
    message: JsonObject = {"role": "assistant", "content": _content(texts) if texts else None}
    if calls:
        message["tool_calls"] = calls
    return message


def _content(parts: list[JsonObject]) -> str | list[JsonObject]:
    """A lone text part becomes a plain string, the form most clients send."""
    if len(parts) == 1 and parts[0]["type"] == "text":
        text: str = parts[0]["text"]
        return text
    return parts


def _tool_content(seq: int, result: ToolResultBlock, out: Rendered) -> str | list[JsonObject]:
    texts = [{"type": "text", "text": p.text} for p in result.content if isinstance(p, TextBlock)]
    media = [p for p in result.content if not isinstance(p, TextBlock)]
    if media:
        out.drop(seq, media, "TOOL_RESULT_MEDIA_DROPPED", f"seq {seq}: Chat Completions tool messages carry text only")
    if result.is_error:
        # The model sees only the output text; the client should know the flag went missing.
        out.warn("IS_ERROR_DROPPED", f"seq {seq}: Chat Completions tool messages have no error flag; left out")
    return _content(texts) if texts else ""


def _part(seq: int, block: object, out: Rendered) -> JsonObject | None:
    match block:
        case TextBlock(text):
            return {"type": "text", "text": text}
        case ImageBlock(media_type, data, uri, detail):
            image: JsonObject = {"url": data_uri(media_type, data) if data is not None else uri}
            if detail:
                image["detail"] = detail
            return {"type": "image_url", "image_url": image}
        case DocumentBlock():
            return _document(seq, block, out)
    raise TypeError(f"cannot render {block!r} in a user or system message")


def _document(seq: int, document: DocumentBlock, out: Rendered) -> JsonObject | None:
    if document.text is not None:
        return {"type": "text", "text": document.text}
    file: JsonObject = {}
    if document.data is not None:
        if document.title:
            file["filename"] = document.title
        file["file_data"] = data_uri(document.media_type, document.data)
    elif document.uri and "://" not in document.uri:
        file["file_id"] = document.uri  # an uploaded file's id, as OpenAI clients send it
    else:
        message = f"seq {seq}: Chat Completions cannot reference a document by URL ({document.uri})"
        out.drop(seq, [document], "DOCUMENT_DROPPED", message)
        return None
    return {"type": "file", "file": file}
