"""pydantic-ai messages to and from Chat Completions messages, the format through which the
pydantic-ai integration (`integrations/pydantic_ai.py`, whose docstring says what each part
becomes) appends to contextd and reads its views back."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from pydantic_ai.messages import (
    ERROR_OUTCOMES,
    BinaryContent,
    CachePoint,
    CompactionPart,
    FilePart,
    ImageUrl,
    ModelMessage,
    ModelRequest,
    ModelRequestPart,
    ModelResponse,
    ModelResponsePart,
    NativeToolCallPart,
    NativeToolReturnPart,
    RetryFeedbackPart,
    RetryPromptPart,
    SpeechPart,
    SystemPromptPart,
    TextContent,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolReturnPart,
    UserContent,
    UserPromptPart,
)

ChatMessage = dict[str, Any]


def to_openai_messages(messages: Sequence[ModelMessage]) -> list[ChatMessage]:
    """pydantic-ai messages as Chat Completions messages, with the extensions contextd reads
    (``reasoning`` on an assistant message, ``is_error`` and ``name`` on a tool message)."""
    return [chat for message in messages for _, chat in chat_of(message)]


def chat_of(message: ModelMessage) -> list[tuple[int, ChatMessage]]:
    """(part index, chat message) per chat message of a pydantic-ai message; -1 for a response."""
    if isinstance(message, ModelResponse):
        chat = _assistant(message.parts)
        return [] if chat is None else [(-1, chat)]
    out = [(i, from_request_part(part)) for i, part in enumerate(message.parts)]
    return [(i, chat) for i, chat in out if chat is not None]


def from_request_part(part: ModelRequestPart) -> ChatMessage | None:
    if isinstance(part, SystemPromptPart):
        return None if part.scope == "request" else {"role": "system", "content": part.content}
    if isinstance(part, UserPromptPart):
        return {"role": "user", "content": _user_content(part.content)}
    if isinstance(part, ToolReturnPart):
        text = part.model_response_str(wrap_if_error=False) + "".join(f"\n{_stand_in(f)}" for f in part.files)
        return _tool_message(part.tool_call_id, part.tool_name, text, part.outcome in ERROR_OUTCOMES)
    if isinstance(part, RetryPromptPart):  # deprecated, but a history built by hand may hold one
        if part.tool_name:
            return _tool_message(part.tool_call_id, part.tool_name, part.model_response(), True)
        return {"role": "user", "content": part.model_response()}
    if isinstance(part, RetryFeedbackPart):
        return {"role": "user", "content": part.model_response()}
    text = _spoken(part)
    return {"role": "user", "content": text} if text else None  # else a record of the framework's own


def _tool_message(call_id: str, name: str, text: str, is_error: bool) -> ChatMessage:
    return {"role": "tool", "tool_call_id": call_id, "name": name, "content": text, "is_error": is_error}


def _spoken(part: ModelRequestPart | ModelResponsePart) -> str:
    """The text of a compaction summary or a speech transcript ("" for any other part)."""
    if isinstance(part, CompactionPart):
        return part.content or ""
    if isinstance(part, SpeechPart):
        return part.transcript or ""
    return ""


def _user_content(content: str | Sequence[UserContent]) -> str | list[ChatMessage]:
    if isinstance(content, str):
        return content
    parts: list[ChatMessage] = []
    for piece in content:
        if isinstance(piece, str | TextContent):
            parts.append({"type": "text", "text": piece if isinstance(piece, str) else piece.content})
        elif isinstance(piece, ImageUrl):
            parts.append({"type": "image_url", "image_url": {"url": piece.url}})
        elif isinstance(piece, BinaryContent) and piece.is_image:
            parts.append({"type": "image_url", "image_url": {"url": piece.data_uri}})
        elif isinstance(piece, BinaryContent) and piece.is_document:
            parts.append({"type": "file", "file": {"file_data": piece.data_uri, "filename": piece.identifier}})
        elif not isinstance(piece, CachePoint):
            parts.append({"type": "text", "text": _stand_in(piece)})
    return parts


def _stand_in(piece: Any) -> str:
    """A line standing for media Chat Completions cannot carry (audio, video, a document by URL)."""
    where = getattr(piece, "url", None) or getattr(piece, "identifier", "")
    return f"[{getattr(piece, 'kind', 'file')} {getattr(piece, 'media_type', '')} {where}]"


def _assistant(parts: Sequence[ModelResponsePart]) -> ChatMessage | None:
    texts: list[str] = []
    reasoning: list[str] = []
    calls: list[ChatMessage] = []
    for part in parts:
        if isinstance(part, TextPart):
            texts.append(part.content)
        elif isinstance(part, ThinkingPart):
            reasoning.append(part.content)
        elif isinstance(part, ToolCallPart):
            arguments = part.args if isinstance(part.args, str) else part.args_as_json_str()  # as the model wrote it
            function = {"name": part.tool_name, "arguments": arguments}
            calls.append({"id": part.tool_call_id, "type": "function", "function": function})
        elif isinstance(part, NativeToolCallPart):  # run by the provider: kept as what it says
            texts.append(f"[{part.tool_name} call: {part.args_as_json_str()}]")
        elif isinstance(part, NativeToolReturnPart):
            texts.append(f"[{part.tool_name} result: {part.model_response_str()}]")
        elif isinstance(part, FilePart):
            texts.append(_stand_in(part.content))
        else:
            texts.append(_spoken(part))
    texts = [t for t in texts if t]
    if not texts and not calls and not any(reasoning):
        return None
    content: str | list[ChatMessage] | None = None
    if texts:
        content = texts[0] if len(texts) == 1 else [{"type": "text", "text": t} for t in texts]
    chat: ChatMessage = {"role": "assistant", "content": content}
    if any(reasoning):
        chat["reasoning"] = "\n\n".join(r for r in reasoning if r)
    if calls:
        chat["tool_calls"] = calls
    return chat


# ------------------------------------------------------------------ Chat Completions -> pydantic-ai


def from_openai_messages(
    messages: Sequence[Mapping[str, Any]], *, conversation_id: str | None = None
) -> list[ModelMessage]:
    """Chat Completions messages (a contextd view's) as pydantic-ai messages: consecutive
    system, user and tool messages make one `ModelRequest`, an assistant message a
    `ModelResponse`; a tool result gets the name of the call it answers."""
    names = tool_names(messages)
    out: list[ModelMessage] = []
    parts: list[ModelRequestPart] = []
    for chat in messages:
        if chat.get("role") == "assistant":
            if parts:
                out.append(ModelRequest(parts=parts, conversation_id=conversation_id))
                parts = []
            out.append(replace(response_of(chat), conversation_id=conversation_id))
        else:
            parts.append(request_part(chat, names))
    if parts:
        out.append(ModelRequest(parts=parts, conversation_id=conversation_id))
    return out


def tool_names(messages: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    return {
        call["id"]: call["function"]["name"]
        for chat in messages
        if chat.get("role") == "assistant"
        for call in chat.get("tool_calls") or ()
    }


def _texts(content: Any) -> list[str]:
    if isinstance(content, str):
        return [content] if content else []
    return [p["text"] for p in content or () if p.get("type") == "text" and p["text"]]


def response_of(chat: Mapping[str, Any]) -> ModelResponse:
    parts: list[ModelResponsePart] = []
    if chat.get("reasoning"):
        parts.append(ThinkingPart(chat["reasoning"]))
    parts.extend(TextPart(text) for text in _texts(chat.get("content")))
    for call in chat.get("tool_calls") or ():
        function = call["function"]
        parts.append(
            ToolCallPart(tool_name=function["name"], args=function.get("arguments") or "{}", tool_call_id=call["id"])
        )
    return ModelResponse(parts=parts)


def request_part(chat: Mapping[str, Any], names: Mapping[str, str]) -> ModelRequestPart:
    role, content = chat.get("role"), chat.get("content")
    if role == "tool":
        call_id = chat["tool_call_id"]
        text = "\n".join(_texts(content))
        return ToolReturnPart(tool_name=names.get(call_id, chat.get("name", "")), content=text, tool_call_id=call_id)
    if role == "system":
        return SystemPromptPart("\n".join(_texts(content)))
    if isinstance(content, str):
        return UserPromptPart(content)
    pieces: list[UserContent] = []
    for part in content or ():
        if part.get("type") == "text":
            pieces.append(part["text"])
        elif part.get("type") == "image_url":
            url = part["image_url"]["url"]
            pieces.append(BinaryContent.from_data_uri(url) if url.startswith("data:") else ImageUrl(url))
        elif part.get("type") == "file" and "file_data" in part["file"]:
            pieces.append(BinaryContent.from_data_uri(part["file"]["file_data"]))
        else:
            pieces.append(json.dumps(part))
    return UserPromptPart(pieces[0] if len(pieces) == 1 and isinstance(pieces[0], str) else pieces)
