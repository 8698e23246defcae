"""Provider request rules, written from the providers' documentation (and, for the
Responses API's pairing of reasoning by id, from the errors it answers), to check
rendered views against (property tests, repair tests).

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

from collections.abc import Mapping
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


def check_responses(items: list[Message], pairs: Mapping[str, str] | None = None) -> None:
    """OpenAI Responses input: messages have a known role and non-empty content (assistant
    text as a string or output_text parts); every function_call is answered by one
    function_call_output, after it, before the next message from the user; an output answers
    a call made before it; a reasoning item carries an id and is directly followed by an item
    with an id (the items it led to); an item whose id `pairs` names (the id of the reasoning
    it was produced after, in the history) is sent after that reasoning, in its turn, or
    without its id; ids are unique."""
    pending: list[str] = []
    answered: set[str] = set()
    ids: set[str] = set()
    reasoning_open, turn_reasoning = False, ""
    for i, item in enumerate(items):
        kind, where = item.get("type", "message"), f"input[{i}]"
        if "id" in item:
            if item["id"] in ids:
                raise Violation(f"{where}: repeated id {item['id']}")
            ids.add(item["id"])
        if reasoning_open and "id" not in item:
            raise Violation(f"{where}: follows a reasoning item without an id to pair with it")
        if kind == "reasoning":
            if not item.get("id"):
                raise Violation(f"{where}: reasoning without an id")
            if not isinstance(item.get("summary"), list):
                raise Violation(f"{where}: reasoning needs a summary list")
            reasoning_open, turn_reasoning = True, item["id"]
            continue
        reasoning_open = False
        if "id" in item and (pairs or {}).get(item["id"], turn_reasoning) != turn_reasoning:
            raise Violation(f"{where}: {item['id']} is sent without the reasoning it pairs with")
        if kind == "function_call":
            if item["call_id"] in pending or item["call_id"] in answered:
                raise Violation(f"{where}: repeated call id")
            if not isinstance(item["arguments"], str):
                raise Violation(f"{where}: arguments must be a JSON string")
            pending.append(item["call_id"])
            continue
        if kind == "function_call_output":
            if item["call_id"] not in pending:
                raise Violation(f"{where}: answers no pending call ({item['call_id']})")
            pending.remove(item["call_id"])
            answered.add(item["call_id"])
            if not isinstance(item["output"], str | list):
                raise Violation(f"{where}: output must be a string or a list of parts")
            continue
        if kind != "message":
            raise Violation(f"{where}: unknown item type {kind}")
        role = item["role"]
        if role not in ("user", "system", "developer", "assistant"):
            raise Violation(f"{where}: unknown role {role}")
        _non_empty(item.get("content"), where)
        if role == "assistant":
            if isinstance(item["content"], list) and any(p["type"] != "output_text" for p in item["content"]):
                raise Violation(f"{where}: assistant content parts are output_text")
            continue
        turn_reasoning = ""
        if pending:
            raise Violation(f"{where}: calls {pending} were not answered before this {role} message")
        if isinstance(item["content"], list) and any(
            p["type"] not in ("input_text", "input_image", "input_file") for p in item["content"]
        ):
            raise Violation(f"{where}: {role} content parts are input_text, input_image or input_file")
    if reasoning_open:
        raise Violation("the last item is a reasoning item: nothing follows it to pair with")
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


# ------------------------------------------------------------ Bedrock Converse

_ALNUM = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
_CONVERSE_ID_CHARS = _ALNUM | set("_-")
_CONVERSE_NAME_CHARS = _ALNUM | set("-()[] ")
_CONVERSE_IMAGES = ("png", "jpeg", "gif", "webp")
_CONVERSE_DOCUMENTS = ("pdf", "csv", "doc", "docx", "xls", "xlsx", "html", "txt", "md")
_CONVERSE_BLOCKS = {
    "user": ("text", "image", "document", "toolResult", "cachePoint"),
    "assistant": ("text", "toolUse", "reasoningContent", "cachePoint"),
}


def check_converse(system: Any, messages: list[Message]) -> None:
    """Amazon Bedrock Converse: `system` is absent or a list of text (or cachePoint) blocks;
    messages are from the user or the assistant, the first from the user, and alternate; content
    is a non-empty list of blocks that each set one member; text is never blank (in a tool
    result either); images and documents (and tool results) only in user messages, tool calls
    and reasoning only in assistant ones; an image is png, jpeg, gif or webp, from bytes (base64
    in JSON) or S3; a document has a known format, a name of letters, digits, single spaces,
    hyphens, parentheses and brackets (at most 200), unique in the request whatever the case,
    and text beside it in its message; a toolUse has an id of at most 64 letters, digits, _ and
    -, unique, and an object input; the next message answers every call of an assistant
    message with one toolResult each, first in it (as Claude wants), and a toolResult answers a
    call of the message before it; a result holds at least one block (text, a json object, an
    image or a document), and its status is success or error; reasoning is signed text or
    redacted bytes."""
    if system is not None:
        if not isinstance(system, list):
            raise Violation("system must be a list of blocks")
        for k, block in enumerate(system):
            if set(block) != {"text"} and set(block) != {"cachePoint"}:
                raise Violation(f"system[{k}]: a text or cachePoint block, not {sorted(block)}")
            if "text" in block:
                _converse_text(block["text"], f"system[{k}]")
    names: set[str] = set()
    calls: set[str] = set()
    pending: list[str] = []
    for i, message in enumerate(messages):
        where, role, content = f"messages[{i}]", message["role"], message["content"]
        if role not in _CONVERSE_BLOCKS:
            raise Violation(f"{where}: unknown role {role}")
        if i == 0 and role != "user":
            raise Violation("the first message must be the user's")
        if i > 0 and messages[i - 1]["role"] == role:
            raise Violation(f"{where}: two {role} messages in a row")
        if not isinstance(content, list) or not content:
            raise Violation(f"{where}: content must be a non-empty list")
        kinds = [_converse_kind(b, f"{where}.content[{j}]") for j, b in enumerate(content)]
        for j, (kind, block) in enumerate(zip(kinds, content, strict=True)):
            at = f"{where}.content[{j}]"
            if kind not in _CONVERSE_BLOCKS[role]:
                raise Violation(f"{at}: {role} messages cannot hold {kind}")
            _converse_block(kind, block[kind], at, names, calls)
        if "document" in kinds and "text" not in kinds:
            raise Violation(f"{where}: a message with a document needs a text block too")
        answers = [b["toolResult"]["toolUseId"] for b in content if "toolResult" in b]
        if kinds[: len(answers)] != ["toolResult"] * len(answers):
            raise Violation(f"{where}: the tool results come first in their message")
        if sorted(answers) != sorted(pending):
            raise Violation(f"{where}: answers {answers}, the message before called {pending}")
        pending = [b["toolUse"]["toolUseId"] for b in content if "toolUse" in b]
    if pending:
        raise Violation(f"calls {pending} were never answered")


def _converse_kind(block: Any, where: str) -> str:
    if not isinstance(block, dict) or len(block) != 1:
        raise Violation(f"{where}: a block sets exactly one member")
    kind: str = next(iter(block))
    return kind


def _converse_text(text: Any, where: str) -> None:
    if not isinstance(text, str) or not text.strip():
        raise Violation(f"{where}: text must not be blank")


def _converse_bytes(data: Any, where: str) -> None:
    import base64  # local: the Converse rules are one self-contained block

    if not isinstance(data, str) or not data:
        raise Violation(f"{where}: bytes travel as non-empty base64 text")
    base64.b64decode(data, validate=True)


def _converse_block(kind: str, body: Any, where: str, names: set[str], calls: set[str]) -> None:
    if kind == "text":
        _converse_text(body, where)
    elif kind == "image":
        if body["format"] not in _CONVERSE_IMAGES:
            raise Violation(f"{where}: image format {body['format']!r}")
        _converse_source(body["source"], where, ("bytes", "s3Location"))
    elif kind == "document":
        if body.get("format") not in _CONVERSE_DOCUMENTS:
            raise Violation(f"{where}: document format {body.get('format')!r}")
        name = body["name"]
        if not 0 < len(name) <= 200 or set(name) - _CONVERSE_NAME_CHARS or "  " in name or name != name.strip():
            raise Violation(f"{where}: document name {name!r}")
        if name.casefold() in names:
            raise Violation(f"{where}: document name {name!r} repeats")
        names.add(name.casefold())
        _converse_source(body["source"], where, ("bytes", "s3Location", "text"))
    elif kind == "toolUse":
        call = body["toolUseId"]
        if not 0 < len(call) <= 64 or set(call) - _CONVERSE_ID_CHARS or call in calls:
            raise Violation(f"{where}: toolUseId {body['toolUseId']!r} is malformed or repeats")
        calls.add(body["toolUseId"])
        if not body.get("name") or not isinstance(body.get("input"), dict):
            raise Violation(f"{where}: a toolUse has a name and an object input")
    elif kind == "toolResult":
        if body.get("status", "success") not in ("success", "error"):
            raise Violation(f"{where}: status {body['status']!r}")
        if not isinstance(body.get("content"), list) or not body["content"]:
            raise Violation(f"{where}: a toolResult holds at least one block")
        for k, part in enumerate(body["content"]):
            at = f"{where}.content[{k}]"
            part_kind = _converse_kind(part, at)
            if part_kind == "json":
                if not isinstance(part["json"], dict):
                    raise Violation(f"{at}: json must be an object")
            elif part_kind in ("text", "image", "document"):
                _converse_block(part_kind, part[part_kind], at, names, calls)
            else:
                raise Violation(f"{at}: a toolResult cannot hold {part_kind}")
    elif kind == "reasoningContent":
        if set(body) == {"redactedContent"}:
            _converse_bytes(body["redactedContent"], where)
        elif set(body) != {"reasoningText"} or not body["reasoningText"].get("signature"):
            raise Violation(f"{where}: reasoning must be signed text or redacted content")


def _converse_source(source: Any, where: str, kinds: tuple[str, ...]) -> None:
    kind = _converse_kind(source, f"{where}.source")
    if kind not in kinds:
        raise Violation(f"{where}: source {kind!r}")
    if kind == "bytes":
        _converse_bytes(source["bytes"], f"{where}.source")
    elif kind == "s3Location" and not source["s3Location"]["uri"].startswith("s3://"):
        raise Violation(f"{where}: an s3Location uri starts with s3://")
    elif kind == "text":
        _converse_text(source["text"], f"{where}.source")
