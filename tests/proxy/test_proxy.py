"""`contextd proxy` with the official `openai` and `anthropic` SDKs pointed at it, each running a
multi-turn tool-calling loop against a stub provider: the provider gets contextd's views, the
session holds every turn once, usage is predicted and reported, and a contextd that is down
costs the agent nothing."""

from __future__ import annotations

import json
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anthropic
import openai
import pytest

from contextd.proxy.app import SESSION_HEADER, VIEW_VERSION_HEADER
from contextd.proxy.dialects import BY_PATH
from contextd.proxy.ledger import chains
from contextd_client import Client
from contextd_lab.stub_upstream import FINAL, Upstream
from tests.conftest import ServerThread

SYSTEM = "You are a coding agent. Use bash to run the tests."
TASK = "Find the failing test."
LOG_LINES = 1500
TURNS = 3
PARAMETERS = {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}
BASH: dict[str, Any] = {"name": "bash", "description": "Run a shell command."}
CHAT_TOOLS: list[Any] = [{"type": "function", "function": {**BASH, "parameters": PARAMETERS}}]
RESPONSES_TOOLS: list[Any] = [{"type": "function", **BASH, "parameters": PARAMETERS}]
ANTHROPIC_TOOLS: list[Any] = [{**BASH, "input_schema": PARAMETERS}]


def run_tests(command: str) -> str:
    """A tool's long output: a test log with one failure, as an agent's bash would return."""
    n = int(command.rsplit(" ", 1)[-1])
    lines = [f"tests/test_app.py::test_case_{k} {'FAILED' if k == 700 + n else 'PASSED'}" for k in range(LOG_LINES)]
    return "\n".join([f"$ {command}", *lines, f"1 failed, {LOG_LINES - 1} passed in 3.2s"])


@dataclass
class Loop:
    """What an SDK's loop sent and what it ended with: `conversation` as the SDK would send it
    next (less the lead), `calls` the number of model calls."""

    conversation: list[Any]
    calls: int
    final: str
    view_versions: list[int]


def chat_loop(base_url: str, headers: dict[str, str], *, stream: bool) -> Loop:
    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="sk-test", default_headers=headers, max_retries=0)
    messages: list[Any] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK}]
    versions: list[int] = []
    for calls in range(1, 10):
        if stream:
            with client.chat.completions.stream(model="gpt-4o", messages=messages, tools=CHAT_TOOLS) as events:
                message: Any = events.get_final_completion().choices[0].message
                versions.append(int(events._response.headers.get(VIEW_VERSION_HEADER, 0)))
        else:
            raw = client.chat.completions.with_raw_response.create(model="gpt-4o", messages=messages, tools=CHAT_TOOLS)
            versions.append(int(raw.headers.get(VIEW_VERSION_HEADER, 0)))
            message = raw.parse().choices[0].message
        messages.append(message)  # the SDK's own object, as agents pass it back
        if not message.tool_calls:
            return Loop(messages[1:], calls, message.content or "", versions)
        for call in message.tool_calls:
            output = run_tests(json.loads(call.function.arguments)["command"])
            messages.append({"role": "tool", "tool_call_id": call.id, "content": output})
    raise AssertionError("the loop did not end")


def responses_loop(base_url: str, headers: dict[str, str], *, stream: bool) -> Loop:
    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="sk-test", default_headers=headers, max_retries=0)
    items: list[Any] = [{"role": "user", "content": TASK}]
    versions: list[int] = []
    for calls in range(1, 10):
        kwargs: dict[str, Any] = {"model": "gpt-4.1", "instructions": SYSTEM, "input": items, "tools": RESPONSES_TOOLS}
        if stream:
            with client.responses.stream(**kwargs) as events:
                response: Any = events.get_final_response()
                versions.append(int(events._response.headers.get(VIEW_VERSION_HEADER, 0)))
        else:
            raw = client.responses.with_raw_response.create(**kwargs)
            versions.append(int(raw.headers.get(VIEW_VERSION_HEADER, 0)))
            response = raw.parse()
        items.extend(response.output)
        called = [o for o in response.output if o.type == "function_call"]
        if not called:
            return Loop(items, calls, response.output_text, versions)
        for call in called:
            output = run_tests(json.loads(call.arguments)["command"])
            items.append({"type": "function_call_output", "call_id": call.call_id, "output": output})
    raise AssertionError("the loop did not end")


def messages_loop(base_url: str, headers: dict[str, str], *, stream: bool) -> Loop:
    client = anthropic.Anthropic(base_url=base_url, api_key="sk-ant-test", default_headers=headers, max_retries=0)
    messages: list[Any] = [{"role": "user", "content": TASK}]
    versions: list[int] = []
    for calls in range(1, 10):
        kwargs: dict[str, Any] = {
            "model": "claude-sonnet-4-5",
            "max_tokens": 1024,
            "system": SYSTEM,
            "messages": messages,
            "tools": ANTHROPIC_TOOLS,
        }
        if stream:
            with client.messages.stream(**kwargs) as events:
                message: Any = events.get_final_message()
                versions.append(int(events.response.headers.get(VIEW_VERSION_HEADER, 0)))
        else:
            raw = client.messages.with_raw_response.create(**kwargs)
            versions.append(int(raw.headers.get(VIEW_VERSION_HEADER, 0)))
            message = raw.parse()
        messages.append({"role": "assistant", "content": message.content})
        uses = [b for b in message.content if b.type == "tool_use"]
        if not uses:
            return Loop(messages, calls, message.content[0].text, versions)
        results = [{"type": "tool_result", "tool_use_id": b.id, "content": run_tests(b.input["command"])} for b in uses]
        messages.append({"role": "user", "content": results})
    raise AssertionError("the loop did not end")


LOOPS: dict[str, Callable[..., Loop]] = {
    "/v1/chat/completions": chat_loop,
    "/v1/responses": responses_loop,
    "/v1/messages": messages_loop,
}
CASES = [
    pytest.param(path, stream, id=f"{path.rsplit('/', 1)[-1]}-{'sse' if stream else 'json'}")
    for path in LOOPS
    for stream in (False, True)
]


def as_sent(value: Any) -> Any:
    """The SDK's conversation as JSON (its objects dumped, as it dumps them into a request)."""
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json", exclude_none=True)
    if isinstance(value, dict):
        return {k: as_sent(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [as_sent(v) for v in value]
    return value


def conversation_of(path: str, body: dict[str, Any]) -> list[Any]:
    """The conversation (less the lead) of a request the stub received."""
    split = BY_PATH[path].split(body)
    return [item.SerializeToString(deterministic=True) for item in split.items]


@pytest.mark.parametrize(("path", "stream"), CASES)
def test_an_sdk_loop_through_the_proxy_sends_views_and_the_session_holds_every_turn_once(
    contextd: ServerThread,
    upstream: tuple[Upstream, str],
    make_proxy: Callable[..., str],
    path: str,
    stream: bool,
) -> None:
    stub, _ = upstream
    stub.turns = TURNS
    proxy = make_proxy(contextd.target)
    session = f"proxy-{uuid.uuid4().hex[:12]}"
    loop = LOOPS[path](proxy, {SESSION_HEADER: session}, stream=stream)

    assert loop.final == FINAL and loop.calls == TURNS + 1 == len(stub.received)
    assert all(r.path == path for r in stub.received)
    key = "sk-ant-test" if path == "/v1/messages" else "sk-test"
    assert all(key in r.headers.get("x-api-key", "") + r.headers.get("authorization", "") for r in stub.received)
    dialect = BY_PATH[path]
    with Client(contextd.target) as client:
        sent = dialect.split(_request(path, as_sent(loop.conversation))).items
        # The last answer is recorded after the SDK has it.
        settled(lambda: client.get_session(session).version == len(sent))
        settled(lambda: client.get_status(session).usage.reported_calls == loop.calls)  # type: ignore[union-attr]
        # The session holds the conversation the SDK holds, every turn once, nothing retracted.
        stored = client.render_view(session, dialect.format, as_stored=True)
        held = dialect.split(dialect.with_view({"model": "m", "messages": [], "input": []}, [], stored)).items
        assert chains(held) == chains(sent)
        assert not [c for c in client.list_certificates(session) if c.rule == "retraction"]
        # Each call went upstream with the view contextd rendered for it, not the SDK's messages.
        assert loop.view_versions == sorted(set(loop.view_versions)) and min(loop.view_versions) > 0
        last = stub.received[-1]
        assert conversation_of(path, last.body) != conversation_of(
            path, _request(path, as_sent(loop.conversation[:-1]))
        )
        assert len(last.raw) < len(json.dumps(as_sent(loop.conversation))) / 2
        offloaded = client.get_status(session).offloaded
        assert offloaded and all(o.handle in last.raw.decode() for o in offloaded)
        # Every other field as the caller sent it.
        assert last.body["model"] and last.body["tools"]
        if path == "/v1/messages":
            assert last.body["system"] == SYSTEM and last.body["max_tokens"] == 1024
        elif path == "/v1/responses":
            assert last.body["instructions"] == SYSTEM
        else:
            assert last.body["messages"][0] == {"role": "system", "content": SYSTEM}
        if stream and path == "/v1/chat/completions":  # the proxy asked for usage; the SDK never saw it asked
            assert last.body["stream_options"] == {"include_usage": True}
        # Predicted and reported usage, for every call.
        usage = client.get_status(session).usage
        assert usage is not None and usage.reported_calls == loop.calls and usage.renders >= loop.calls
        assert usage.reported_cache_read_tokens > 0


def settled(condition: Callable[[], bool], within: float = 15.0) -> None:
    """Wait for what the proxy does after the caller has its answer."""
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, "not settled"
        time.sleep(0.02)


def _request(path: str, conversation: list[Any]) -> dict[str, Any]:
    return {"messages": conversation} if path != "/v1/responses" else {"input": conversation}


@pytest.mark.parametrize(("path", "stream"), CASES)
def test_with_contextd_down_the_same_loop_completes_with_the_callers_requests(
    upstream: tuple[Upstream, str], make_proxy: Callable[..., str], path: str, stream: bool
) -> None:
    stub, _ = upstream
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        nowhere = f"127.0.0.1:{unused.getsockname()[1]}"
    proxy = make_proxy(nowhere, timeout=2.0)
    loop = LOOPS[path](proxy, {SESSION_HEADER: "down"}, stream=stream)

    assert loop.final == FINAL and loop.calls == len(stub.received) == TURNS + 1
    assert loop.view_versions == [0] * loop.calls  # no view: sent as the caller sent it
    last = stub.received[-1]
    assert conversation_of(path, last.body) == conversation_of(path, _request(path, as_sent(loop.conversation[:-1])))
    if stream and path == "/v1/chat/completions":
        assert "stream_options" not in last.body
