"""Provider request rules, written from the providers' documentation, to
check rendered views against (property tests, repair tests).

OpenAI Chat Completions: an assistant message with `tool_calls` must be
followed by one `tool` message per call id (and no other message in
between); a `tool` message must answer a call of the preceding assistant
message; user/system content is a non-empty string or list; an assistant
message has content or tool calls.

Anthropic Messages: the first message is from the user; consecutive
messages of one role are combined into one turn by the API; a turn with
`tool_use` blocks must be followed by a user turn that starts with a
`tool_result` for each of them; a `tool_result` must answer a `tool_use` of
the previous assistant turn; content is never empty; a `thinking` block
carries its signature. Prompt caching: at most four blocks (system
included) carry `cache_control`, of type `ephemeral`, never a thinking
block or an empty text.
"""

from __future__ import annotations

from typing import Any

Message = dict[str, Any]


class Violation(AssertionError):
    pass


def _non_empty(content: Any, where: str) -> None:
    if content in ("", [], None):
        raise Violation(f"{where}: empty content")


def check_openai(messages: list[Message]) -> None:
    pending: list[str] = []
    for i, message in enumerate(messages):
        role, where = message["role"], f"messages[{i}]"
        if role == "tool":
            if message["tool_call_id"] not in pending:
                raise Violation(f"{where}: tool message answers no pending call ({message['tool_call_id']})")
            pending.remove(message["tool_call_id"])
            continue
        if pending:
            raise Violation(f"{where}: calls {pending} were not answered before this {role} message")
        if role == "assistant":
            calls = [c["id"] for c in message.get("tool_calls", [])]
            if len(set(calls)) != len(calls):
                raise Violation(f"{where}: repeated call id")
            if not calls:
                _non_empty(message.get("content"), where)
            pending = calls
        elif role in ("user", "system"):
            _non_empty(message.get("content"), where)
        else:
            raise Violation(f"{where}: unknown role {role}")
    if pending:
        raise Violation(f"calls {pending} were never answered")


def _blocks(content: Any) -> list[dict[str, Any]]:
    return [{"type": "text", "text": content}] if isinstance(content, str) else list(content)


def check_anthropic(system: Any, messages: list[Message]) -> None:
    if system is not None and not isinstance(system, str | list):
        raise Violation("system must be a string or a list of text blocks")
    turns: list[tuple[str, list[dict[str, Any]]]] = []
    for i, message in enumerate(messages):
        _non_empty(message["content"], f"messages[{i}]")
        if message["role"] not in ("user", "assistant"):
            raise Violation(f"messages[{i}]: unknown role {message['role']}")
        if turns and turns[-1][0] == message["role"]:
            turns[-1][1].extend(_blocks(message["content"]))  # the API combines them
        else:
            turns.append((message["role"], _blocks(message["content"])))
    if turns and turns[0][0] != "user":
        raise Violation("the first turn must be the user's")
    marked = [
        b
        for b in [*(system if isinstance(system, list) else ()), *(b for _, bs in turns for b in bs)]
        if "cache_control" in b
    ]
    if len(marked) > 4:
        raise Violation(f"{len(marked)} blocks carry cache_control: at most 4")
    for block in marked:
        if block["cache_control"].get("type") != "ephemeral":
            raise Violation(f"cache_control {block['cache_control']!r}: the type is ephemeral")
        if block["type"] in ("thinking", "redacted_thinking") or (block["type"] == "text" and not block["text"]):
            raise Violation(f"a {block['type']} block cannot carry cache_control")
    for t, (role, blocks) in enumerate(turns):
        for block in blocks:
            if block["type"] == "thinking" and not block.get("signature"):
                raise Violation(f"turn {t}: thinking without a signature")
        if role != "assistant":
            results = [b["tool_use_id"] for b in blocks if b["type"] == "tool_result"]
            previous = [b["id"] for b in turns[t - 1][1] if b["type"] == "tool_use"] if t > 0 else []
            if any(r not in previous for r in results):
                raise Violation(f"turn {t}: a tool_result answers no tool_use of the previous turn")
            continue
        calls = [b["id"] for b in blocks if b["type"] == "tool_use"]
        if not calls:
            continue
        if t + 1 >= len(turns):
            raise Violation(f"turn {t}: tool calls {calls} are not answered")
        following = turns[t + 1][1]
        leading = [b["tool_use_id"] for b in following[: len(calls)] if b["type"] == "tool_result"]
        if sorted(leading) != sorted(calls):
            raise Violation(f"turn {t + 1}: must start with a tool_result for each of {calls}, has {leading}")
