"""The three provider APIs the proxy speaks, each as a `Dialect`: where a request's
conversation is, how the view takes its place, and how an answer (a JSON body or a stream
of server-sent events) reads back as the assistant's turn and the provider's usage.

A request splits into its *lead* and its *conversation*. The lead is the system part as the
caller sent it (Anthropic's `system`, Responses' `instructions`, and the system or developer
messages that open a Chat Completions `messages` or a Responses `input`); it goes upstream
untouched, so its bytes, and any `cache_control` the caller set in it, are the caller's own.
The conversation is what contextd keeps and views. Agents often vary the lead from call to
call (a date, a memory, a reminder); kept out of the history, such a change never reads as an
edit of it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from contextd_client import Usage, View, ViewFormat
from contextd_client.formats import items_from_anthropic, items_from_openai, items_from_responses
from contextd_client.v1 import content_pb2 as pb

_SYSTEM_ROLES = ("system", "developer")
_ANTHROPIC_BREAKPOINTS = 4
"""The Messages API takes at most four `cache_control` breakpoints in a request."""

# Context windows by model-name prefix, longest prefix first, from the providers' model pages
# (tokens of input and output together). A model none names gets no budget from its name.
_WINDOWS: tuple[tuple[str, int], ...] = (
    ("gpt-4.1", 1_047_576),
    ("gpt-4o", 128_000),
    ("gpt-5", 400_000),
    ("o1", 200_000),
    ("o3", 200_000),
    ("o4", 200_000),
    ("claude-", 200_000),
)


class Unsupported(ValueError):
    """A request the proxy forwards as it is: a conversation held by the provider
    (`previous_response_id`), or one it cannot read."""


@dataclass(frozen=True, slots=True)
class Split:
    """A request read: its lead (the system part, sent as it came), its conversation as items."""

    lead: Any
    items: list[pb.Item]


class Dialect:
    """One provider API. Subclasses fill in the request and answer shapes."""

    name: str
    provider: str
    path: str
    format: ViewFormat

    def split(self, body: Mapping[str, Any]) -> Split:
        raise NotImplementedError

    def with_view(self, body: Mapping[str, Any], lead: Any, view: View) -> dict[str, Any]:
        """The request to send upstream: `body` with the view in place of its conversation."""
        raise NotImplementedError

    def lead_text(self, body: Mapping[str, Any], lead: Any) -> str:
        """The lead as text, for the session fingerprint and the budget."""
        return json.dumps(lead, sort_keys=True, ensure_ascii=False) if lead else ""

    def place_breakpoint(self, body: Mapping[str, Any]) -> bool:
        """Whether the view should place its prompt-cache breakpoint."""
        return False

    def stream_request(self, body: dict[str, Any]) -> bool:
        """Make a streaming request report usage; True when the caller did not ask for it, so
        the event that carries only the usage is the proxy's and is not relayed."""
        return False

    def stream(self) -> Accumulator:
        raise NotImplementedError

    def reply(self, answer: Mapping[str, Any]) -> list[pb.Item]:
        """The assistant's turn in a complete answer (a JSON body, or a stream's sum)."""
        raise NotImplementedError

    def usage(self, answer: Mapping[str, Any]) -> Usage | None:
        raise NotImplementedError

    def output_limit(self, body: Mapping[str, Any]) -> int:
        for key in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
            value = body.get(key)
            if isinstance(value, int) and value > 0:
                return value
        return 0


class Accumulator:
    """Sums a stream's events into the complete answer they make."""

    usage_only: bool = False
    """Whether the last event fed carried only the usage (see `Dialect.stream_request`)."""

    def feed(self, event: str, data: str) -> None:
        raise NotImplementedError

    def answer(self) -> dict[str, Any] | None:
        """The complete answer; None when the stream did not complete."""
        raise NotImplementedError


def window_of(model: str) -> int:
    """The context window of `model` by its name; 0 when unknown."""
    for prefix, window in _WINDOWS:
        if model.startswith(prefix):
            return window
    return 0


def _conversation(messages: Any, field: str) -> tuple[list[Any], list[Any]]:
    if not isinstance(messages, list):
        raise Unsupported(f"{field} is not a list")
    lead = 0
    while lead < len(messages) and isinstance(messages[lead], Mapping) and messages[lead].get("role") in _SYSTEM_ROLES:
        lead += 1
    return messages[:lead], messages[lead:]


def _items(convert: Callable[[Any], list[pb.Item]], conversation: Any) -> list[pb.Item]:
    try:
        return convert(conversation)
    except (ValueError, TypeError, KeyError) as exc:
        raise Unsupported(f"the conversation cannot be read: {exc}") from exc


# ------------------------------------------------------------- Chat Completions


class OpenAIChat(Dialect):
    name = "openai_chat"
    provider = "openai"
    path = "/v1/chat/completions"
    format = ViewFormat.OPENAI_CHAT

    def split(self, body: Mapping[str, Any]) -> Split:
        lead, conversation = _conversation(body.get("messages"), "messages")
        return Split(lead, _items(items_from_openai, conversation))

    def with_view(self, body: Mapping[str, Any], lead: Any, view: View) -> dict[str, Any]:
        return {**body, "messages": [*lead, *view.messages]}

    def stream_request(self, body: dict[str, Any]) -> bool:
        options = body.get("stream_options")
        if isinstance(options, Mapping) and options.get("include_usage"):
            return False
        body["stream_options"] = {**(options if isinstance(options, Mapping) else {}), "include_usage": True}
        return True

    def stream(self) -> Accumulator:
        return _ChatStream()

    def reply(self, answer: Mapping[str, Any]) -> list[pb.Item]:
        choices = answer.get("choices") or []
        first = next((c for c in choices if c.get("index", 0) == 0), None)
        if first is None or not isinstance(first.get("message"), Mapping):
            return []
        return items_from_openai([first["message"]])

    def usage(self, answer: Mapping[str, Any]) -> Usage | None:
        usage = answer.get("usage")
        return Usage.from_openai(usage, str(answer.get("model", ""))) if usage else None


class _ChatStream(Accumulator):
    def __init__(self) -> None:
        self.model = ""
        self.text: list[str] = []
        self.refusal: list[str] = []
        self.calls: dict[int, dict[str, Any]] = {}
        self.usage: dict[str, Any] | None = None
        self.done = False

    def feed(self, event: str, data: str) -> None:
        if data.strip() == "[DONE]":
            self.done, self.usage_only = True, False
            return
        chunk = json.loads(data)
        self.model = chunk.get("model") or self.model
        choices = chunk.get("choices") or []
        self.usage_only = not choices and bool(chunk.get("usage"))
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for choice in choices:
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if delta.get("content"):
                self.text.append(delta["content"])
            if delta.get("refusal"):
                self.refusal.append(delta["refusal"])
            for part in delta.get("tool_calls") or []:
                call = self.calls.setdefault(
                    int(part.get("index", 0)), {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
                )
                call["id"] = part.get("id") or call["id"]
                function = part.get("function") or {}
                call["function"]["name"] += function.get("name") or ""
                call["function"]["arguments"] += function.get("arguments") or ""

    def answer(self) -> dict[str, Any] | None:
        if not self.done:
            return None
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self.text) if self.text else None}
        if self.refusal:
            message["refusal"] = "".join(self.refusal)
        if self.calls:
            message["tool_calls"] = [self.calls[i] for i in sorted(self.calls)]
        return {"model": self.model, "choices": [{"index": 0, "message": message}], "usage": self.usage}


# ------------------------------------------------------------- Anthropic Messages


class AnthropicMessages(Dialect):
    name = "anthropic_messages"
    provider = "anthropic"
    path = "/v1/messages"
    format = ViewFormat.ANTHROPIC_MESSAGES

    def split(self, body: Mapping[str, Any]) -> Split:
        messages = body.get("messages")
        if not isinstance(messages, list):
            raise Unsupported("messages is not a list")
        return Split(body.get("system"), _items(lambda m: items_from_anthropic(m, None), messages))

    def with_view(self, body: Mapping[str, Any], lead: Any, view: View) -> dict[str, Any]:
        return {**body, "messages": view.messages}

    def lead_text(self, body: Mapping[str, Any], lead: Any) -> str:
        if isinstance(lead, list):  # the text, not the caller's cache_control
            return "\n".join(str(b.get("text", "")) for b in lead if isinstance(b, Mapping))
        return str(lead or "")

    def place_breakpoint(self, body: Mapping[str, Any]) -> bool:
        """Place one when the caller's own breakpoints (system, tools, top level) leave room."""
        taken = _cache_controls(body.get("system")) + _cache_controls(body.get("tools"))
        return taken + (1 if body.get("cache_control") else 0) < _ANTHROPIC_BREAKPOINTS

    def stream(self) -> Accumulator:
        return _AnthropicStream()

    def reply(self, answer: Mapping[str, Any]) -> list[pb.Item]:
        content = answer.get("content")
        if not isinstance(content, list) or not content:
            return []
        return items_from_anthropic([{"role": "assistant", "content": content}], None)

    def usage(self, answer: Mapping[str, Any]) -> Usage | None:
        usage = answer.get("usage")
        return Usage.from_anthropic(usage, str(answer.get("model", ""))) if usage else None


def _cache_controls(value: Any) -> int:
    if not isinstance(value, list):
        return 0
    return sum(1 for block in value if isinstance(block, Mapping) and block.get("cache_control"))


class _AnthropicStream(Accumulator):
    def __init__(self) -> None:
        self.message: dict[str, Any] | None = None
        self.blocks: dict[int, dict[str, Any]] = {}
        self.inputs: dict[int, list[str]] = {}
        self.done = False

    def feed(self, event: str, data: str) -> None:
        payload = json.loads(data)
        kind = payload.get("type", event)
        index = int(payload.get("index", 0))
        if kind == "message_start":
            self.message = dict(payload["message"])
            self.message["usage"] = dict(self.message.get("usage") or {})
        elif kind == "content_block_start":
            self.blocks[index] = dict(payload["content_block"])
        elif kind == "content_block_delta":
            self._delta(index, payload.get("delta") or {})
        elif kind == "content_block_stop" and index in self.inputs:
            self.blocks[index]["input"] = json.loads("".join(self.inputs.pop(index)) or "{}")
        elif kind == "message_delta" and self.message is not None:
            self.message.update(payload.get("delta") or {})
            self.message["usage"].update({k: v for k, v in (payload.get("usage") or {}).items() if v is not None})
        elif kind == "message_stop":
            self.done = True

    def _delta(self, index: int, delta: Mapping[str, Any]) -> None:
        block = self.blocks.setdefault(index, {})
        kind = delta.get("type")
        if kind == "text_delta":
            block["text"] = block.get("text", "") + delta.get("text", "")
        elif kind == "input_json_delta":
            self.inputs.setdefault(index, []).append(delta.get("partial_json", ""))
        elif kind == "thinking_delta":
            block["thinking"] = block.get("thinking", "") + delta.get("thinking", "")
        elif kind == "signature_delta":
            block["signature"] = delta.get("signature", "")
        elif kind == "citations_delta":
            block.setdefault("citations", []).append(delta.get("citation"))

    def answer(self) -> dict[str, Any] | None:
        if not self.done or self.message is None:
            return None
        return {**self.message, "content": [self.blocks[i] for i in sorted(self.blocks)]}


# ------------------------------------------------------------- OpenAI Responses


class OpenAIResponses(Dialect):
    name = "openai_responses"
    provider = "openai"
    path = "/v1/responses"
    format = ViewFormat.OPENAI_RESPONSES

    def split(self, body: Mapping[str, Any]) -> Split:
        for held in ("previous_response_id", "conversation"):
            if body.get(held):
                raise Unsupported(f"the provider holds the conversation ({held})")
        given = body.get("input")
        if isinstance(given, str):
            given = [{"role": "user", "content": given}]
        lead, conversation = _conversation(given, "input")
        return Split(lead, _items(items_from_responses, conversation))

    def with_view(self, body: Mapping[str, Any], lead: Any, view: View) -> dict[str, Any]:
        return {**body, "input": [*lead, *view.messages]}

    def lead_text(self, body: Mapping[str, Any], lead: Any) -> str:
        return str(body.get("instructions") or "") + super().lead_text(body, lead)

    def stream(self) -> Accumulator:
        return _ResponsesStream()

    def reply(self, answer: Mapping[str, Any]) -> list[pb.Item]:
        output = answer.get("output")
        if not isinstance(output, list) or not output:
            return []
        return items_from_responses(output)

    def usage(self, answer: Mapping[str, Any]) -> Usage | None:
        usage = answer.get("usage")
        return Usage.from_openai(usage, str(answer.get("model", ""))) if usage else None


class _ResponsesStream(Accumulator):
    def __init__(self) -> None:
        self.response: dict[str, Any] | None = None

    def feed(self, event: str, data: str) -> None:
        payload = json.loads(data)
        if payload.get("type", event) == "response.completed":
            self.response = payload.get("response")

    def answer(self) -> dict[str, Any] | None:
        return self.response


DIALECTS: Sequence[Dialect] = (OpenAIChat(), AnthropicMessages(), OpenAIResponses())
BY_PATH: Mapping[str, Dialect] = {d.path: d for d in DIALECTS}
