"""LangChain messages to and from Chat Completions messages, the format through which the
LangChain middleware (`integrations/langchain.py`) appends to contextd and reads its views back;
its tool calls as `AgentTools` reads them, and the usage a reply reports."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.messages.utils import convert_to_openai_messages
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool

from contextd_client import Usage, View
from contextd_client.formats import items_from_openai
from contextd_client.v1 import content_pb2 as pb

_EPHEMERAL = {"type": "ephemeral"}
_REASONING_PARTS = {"thinking", "reasoning"}
_CALL_PARTS = {"tool_call", "tool_use", "function_call", "server_tool_call"}  # carried by tool_calls


def items_each(messages: Sequence[BaseMessage], start: int = 0) -> list[list[pb.Item]]:
    """The items of each message from `start` on (none for a message with nothing in it)."""
    return [items_of(message, f"message {index}") for index, message in enumerate(messages[start:], start)]


def items_of(message: BaseMessage, which: str) -> list[pb.Item]:
    try:
        return items_from_openai([storable(m, message) for m in convert_to_openai_messages([message])])
    except ValueError as exc:
        raise ValueError(f"{which} ({type(message).__name__}) cannot be appended to contextd: {exc}") from exc


def storable(converted: dict[str, Any], message: BaseMessage) -> dict[str, Any]:
    """A converted message as contextd takes it: a failed tool's ``is_error``, and an assistant's
    reasoning as ``reasoning`` (the OpenAI Chat view drops it, the history keeps it)."""
    if converted["role"] == "tool" and isinstance(message, ToolMessage) and message.status == "error":
        converted["is_error"] = True
    content = converted.get("content")
    if converted["role"] == "assistant" and isinstance(content, list):
        reasoning = [_reasoning_text(p) for p in content if p.get("type") in _REASONING_PARTS]
        kept = [p for p in content if p.get("type") not in _REASONING_PARTS | _CALL_PARTS]
        converted["content"] = kept
        if any(reasoning):
            converted["reasoning"] = "\n".join(r for r in reasoning if r)
    return converted


def _reasoning_text(part: Mapping[str, Any]) -> str:
    text = part.get("thinking") or part.get("reasoning") or ""
    summary = part.get("summary")
    if not text and isinstance(summary, list):
        text = "\n".join(str(s.get("text", "")) for s in summary if isinstance(s, Mapping))
    return str(text)


def flat(each: list[list[pb.Item]]) -> list[pb.Item]:
    return [item for items in each for item in items]


def openai_tools(tools: Sequence[BaseTool | dict[str, Any]]) -> list[dict[str, Any]]:
    """The call's tools as the OpenAI Chat ``tools`` array (provider tools given as dicts, as they are)."""
    return [tool if isinstance(tool, dict) else convert_to_openai_tool(tool) for tool in tools]


def mark_breakpoint(messages: list[dict[str, Any]], view: View) -> None:
    """Put ``cache_control`` on the last content block of the message holding the view's breakpoint
    (the last message when it is at the end), or of the nearest earlier one with content to mark."""
    at = next((i.message_index for i in view.items if i.seq == view.cache_breakpoint_seq), len(messages) - 1)
    for index in range(min(at, len(messages) - 1), -1, -1):
        content = messages[index].get("content")
        if isinstance(content, str) and content:
            messages[index]["content"] = [{"type": "text", "text": content, "cache_control": _EPHEMERAL}]
            return
        if isinstance(content, list) and content and isinstance(content[-1], dict):
            messages[index]["content"] = [*content[:-1], {**content[-1], "cache_control": _EPHEMERAL}]
            return


def openai_call(call: Mapping[str, Any]) -> dict[str, Any]:
    """A LangChain tool call as a Chat Completions one, as `AgentTools` reads it."""
    arguments = json.dumps(call.get("args") or {}, ensure_ascii=False)
    return {"id": call.get("id") or "", "type": "function", "function": {"name": call["name"], "arguments": arguments}}


def tool_message(call: Mapping[str, Any], result: Mapping[str, Any]) -> ToolMessage:
    content = str(result["content"])
    status = "error" if content.startswith("error: ") else "success"  # how AgentTools words a failed call
    return ToolMessage(content=content, tool_call_id=result["tool_call_id"], name=call["name"], status=status)


def usage_of(messages: Sequence[BaseMessage]) -> Usage | None:
    """What the provider billed for the reply, from LangChain's ``usage_metadata`` (its input counts
    the cached tokens, read and written); None when the model reports none."""
    reply = next((m for m in messages if isinstance(m, AIMessage) and m.usage_metadata), None)
    if reply is None or reply.usage_metadata is None:
        return None
    usage, meta = reply.usage_metadata, reply.response_metadata
    details = usage.get("input_token_details") or {}
    read, written = int(details.get("cache_read") or 0), int(details.get("cache_creation") or 0)
    return Usage(
        provider=str(meta.get("model_provider") or "langchain"),
        model=str(meta.get("model_name") or meta.get("model") or ""),
        input_tokens=max(0, usage["input_tokens"] - read - written),
        output_tokens=usage["output_tokens"],
        cache_read_tokens=read,
        cache_write_tokens=written,
    )
