"""Items to OpenAI Responses ``input`` items.

A system or user item gives one message; a tool item one
``function_call_output``; an assistant item as many items as the API splits
a turn into, in its order: ``reasoning``, an assistant ``message`` per run of
text, a ``function_call`` per call. A lone text renders as a string content,
so text round-trips byte for byte.

Ids pair a turn's items. A reasoning item must be followed by the items it
led to, named by their ids, and a ``function_call`` that carries its id must
follow its reasoning (the API answers 400 otherwise). So a turn's reasoning
is sent only with every item after it (up to the next reasoning) carrying its
id as it came; when an edit changed one of them (a stand-in text has no id),
or the reasoning came from another provider (no id), the reasoning is left
out with a warning and the ids of the items it led to go with it (an item
sent without its id is plain input, which the API takes). Items of a turn
that had no reasoning keep their ids.

What Responses cannot carry (a tool result's error flag, a participant name)
is left out with a warning in the view.
"""

from __future__ import annotations

from collections.abc import Sequence

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


def render_responses(items: Sequence[Renderable]) -> Rendered:
    return render_all(ResponsesFolder(), items)


class ResponsesFolder(ItemwiseFolder):
    """An item's input items, final as soon as they are made."""

    def __init__(self, out: Rendered | None = None) -> None:
        super().__init__(_piece, _pieces, out)


def _items(seq: int, role: Role, content: Sequence[Block], out: Rendered) -> list[JsonObject]:
    """The input items of one item's content (`out` hears what was left out)."""
    if role is Role.TOOL:
        result = next(b for b in content if isinstance(b, ToolResultBlock))  # validated at append
        return [{"type": "function_call_output", "call_id": result.tool_use_id, "output": _output(seq, result, out)}]
    if role is Role.ASSISTANT:
        return _turn(seq, content, out)
    parts = [p for p in (_part(seq, b, out) for b in content) if p is not None]
    return [{"role": role.value, "content": _content(parts)}] if parts else []


def _piece(item: Renderable) -> Piece:
    notes = Rendered()
    messages = _items(item.seq, item.role, item.content, notes)
    if messages and item.name:
        notes.warn("NAME_DROPPED", f"seq {item.seq}: Responses input items carry no participant name; left out")
    return Piece(tuple(messages), tuple(map(to_json, messages)), Notes.of(notes))


def _turn(seq: int, content: Sequence[Block], out: Rendered) -> list[JsonObject]:
    """An assistant item's input items, each run after a reasoning block sent with it or
    without it (and without the ids that pair with it)."""
    runs: list[list[Block]] = [[]]
    for block in content:
        if isinstance(block, ReasoningBlock):
            runs.append([])
        runs[-1].append(block)
    items: list[JsonObject] = []
    for run in runs:
        head = run[0] if run and isinstance(run[0], ReasoningBlock) else None
        led = run[1:] if head is not None else run
        paired = head is not None and bool(head.item_id) and bool(led) and all(_id_of(b) for b in led)
        if head is not None:
            if paired:
                items.append(_reasoning(head))
            else:
                out.drop(seq, [head], "REASONING_DROPPED", _why_not_sent(seq, head, led))
        keep_ids = head is None or paired
        items.extend(_assistant_items(led, keep_ids))
    return items


def _why_not_sent(seq: int, reasoning: ReasoningBlock, led: Sequence[Block]) -> str:
    if not reasoning.item_id:
        return f"seq {seq}: reasoning without a Responses id (from another provider) cannot be sent back"
    if not led:
        return f"seq {seq}: reasoning whose following items are not in the view cannot be sent alone"
    return f"seq {seq}: an item this reasoning led to was changed (it lost its id); the reasoning is left out"


def _id_of(block: Block) -> str:
    return block.item_id if isinstance(block, TextBlock | ToolUseBlock | ReasoningBlock) else ""


def _reasoning(block: ReasoningBlock) -> JsonObject:
    reasoning: JsonObject = {
        "type": "reasoning",
        "id": block.item_id,
        "summary": [{"type": "summary_text", "text": block.text}] if block.text else [],
    }
    if block.encrypted_content:
        reasoning["encrypted_content"] = block.encrypted_content
    return reasoning


def _assistant_items(blocks: Sequence[Block], keep_ids: bool) -> list[JsonObject]:
    """Runs of text as assistant messages (one per message id; each text of its own without
    one), calls as function_call items."""
    items: list[JsonObject] = []
    open_id: str | None = None
    for block in blocks:
        if isinstance(block, ToolUseBlock):
            call: JsonObject = {
                "type": "function_call",
                "call_id": block.id,
                "name": block.name,
                "arguments": block.input_json,
            }
            if keep_ids and block.item_id:
                call["id"] = block.item_id
            items.append(call)
            open_id = None
        elif isinstance(block, TextBlock):
            message_id = block.item_id if keep_ids else ""
            if message_id and message_id == open_id:
                items[-1]["content"].append(_output_text(block.text))
            elif message_id:
                items.append(
                    {
                        "type": "message",
                        "role": "assistant",
                        "id": message_id,
                        "status": "completed",
                        "content": [_output_text(block.text)],
                    }
                )
            else:
                items.append({"role": "assistant", "content": block.text})
            open_id = message_id or None
    return items


def _output_text(text: str) -> JsonObject:
    return {"type": "output_text", "text": text, "annotations": []}


def _content(parts: list[JsonObject]) -> str | list[JsonObject]:
    """A lone text part becomes a plain string, the form most clients send."""
    if len(parts) == 1 and parts[0]["type"] == "input_text":
        text: str = parts[0]["text"]
        return text
    return parts


def _output(seq: int, result: ToolResultBlock, out: Rendered) -> str | list[JsonObject]:
    if result.is_error:
        # The model sees only the output; the client should know the flag went missing.
        out.warn("IS_ERROR_DROPPED", f"seq {seq}: Responses function_call_output has no error flag; left out")
    parts = [p for p in (_part(seq, b, out) for b in result.content) if p is not None]
    if not parts:
        return ""
    return _content(parts)


def _part(seq: int, block: object, out: Rendered) -> JsonObject | None:
    match block:
        case TextBlock(text):
            return {"type": "input_text", "text": text}
        case ImageBlock(media_type, data, uri, detail):
            image: JsonObject = {"type": "input_image", "detail": detail or "auto"}
            if data is not None:
                image["image_url"] = data_uri(media_type, data)
            elif uri is not None and "://" not in uri:
                image["file_id"] = uri  # an uploaded file's id, as OpenAI clients send it
            else:
                image["image_url"] = uri
            return image
        case DocumentBlock():
            return _document(seq, block, out)
    raise TypeError(f"cannot render {block!r} in a user or system message")


def _document(seq: int, document: DocumentBlock, out: Rendered) -> JsonObject | None:
    if document.text is not None:
        return {"type": "input_text", "text": document.text}
    file: JsonObject = {"type": "input_file"}
    if document.data is not None:
        if document.title:
            file["filename"] = document.title
        file["file_data"] = data_uri(document.media_type, document.data)
    elif document.uri and "://" not in document.uri:
        file["file_id"] = document.uri
    elif document.uri:
        file["file_url"] = document.uri
    else:
        out.drop(seq, [document], "DOCUMENT_DROPPED", f"seq {seq}: a document without a source")
        return None
    return file
