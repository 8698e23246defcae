"""Acceptance: an OpenAI conversation with parallel tool calls and a tool
error goes through the thin client and the service, comes back as Anthropic
messages and from those back to OpenAI, byte-identical where the formats
allow (docs/formats.md); and a Bedrock Converse conversation in the SDK's form
(bytes as bytes) comes back in that form."""

from __future__ import annotations

import base64
import copy
from typing import Any

from contextd_client import Client, ViewFormat

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n fake image").decode()

CONVERSATION: list[dict[str, Any]] = [
    {"role": "system", "content": "You are a careful coding agent. Ünïcode stays as it is: ✓"},
    {
        "role": "user",
        "content": [
            {"type": "text", "text": "The build fails; here is the screenshot."},
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
        ],
    },
    {
        "role": "assistant",
        "content": "Let me look at both files at once.",
        "tool_calls": [
            {
                "id": "call_a",
                "type": "function",
                "function": {"name": "read_file", "arguments": '{"path": "src/app.py", "lines": [1, 40]}'},
            },
            {
                "id": "call_b",
                "type": "function",
                "function": {"name": "bash", "arguments": '{"command": "pytest -x tests/test_app.py"}'},
            },
        ],
    },
    {"role": "tool", "tool_call_id": "call_a", "content": "def main():\n    return parse(argv)\n"},
    {
        "role": "tool",
        "tool_call_id": "call_b",
        "content": "E   ValueError: not enough values to unpack (expected 2, got 1)\n1 failed",
        "is_error": True,
    },
    {"role": "assistant", "content": "The parser splits on ':' without a limit; fixing it."},
]


def _without_error_flags(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat Completions has no error flag: a view in that format leaves it out (with a warning)."""
    plain = copy.deepcopy(messages)
    for message in plain:
        message.pop("is_error", None)
    return plain


def test_openai_to_anthropic_and_back_through_the_service(client: Client) -> None:
    first = client.create_session().id
    client.append_openai(first, CONVERSATION)

    openai = client.render_view(first, ViewFormat.OPENAI_CHAT)
    assert openai.messages == _without_error_flags(CONVERSATION)
    assert [w.code for w in openai.warnings] == ["IS_ERROR_DROPPED"]

    anthropic = client.render_anthropic(first)
    assert anthropic["system"] == CONVERSATION[0]["content"]
    calls = anthropic["messages"][1]["content"]
    assert [b["type"] for b in calls] == ["text", "tool_use", "tool_use"]  # parallel calls in one turn
    results = anthropic["messages"][2]["content"]
    assert [(b["tool_use_id"], b.get("is_error", False)) for b in results] == [("call_a", False), ("call_b", True)]

    # Back: the Anthropic payload, as a client would hold it, into a new session.
    second = client.create_session().id
    client.append_anthropic(second, anthropic["messages"], system=anthropic["system"])
    assert client.render_anthropic(second) == anthropic  # Anthropic -> Anthropic is exact, is_error included
    assert client.render_openai(second) == _without_error_flags(CONVERSATION)

    # Byte-identical text and arguments, not only equal JSON.
    original = CONVERSATION[2]["tool_calls"][0]["function"]["arguments"]
    returned = client.render_openai(second)[2]["tool_calls"][0]["function"]["arguments"]
    assert returned.encode() == original.encode()
    assert client.render_openai(second)[0]["content"].encode() == CONVERSATION[0]["content"].encode()


def test_converse_in_the_sdks_form_comes_back_as_it_went_in(client: Client) -> None:
    """What boto3 hands over (bytes as bytes) appended, and rendered back in that form."""
    image = b"\x89PNG\r\n\x1a\n fake image"
    messages: list[dict[str, Any]] = [
        {
            "role": "user",
            "content": [{"text": "What fails here?"}, {"image": {"format": "png", "source": {"bytes": image}}}],
        },
        {
            "role": "assistant",
            "content": [
                {"reasoningContent": {"reasoningText": {"text": "Run the tests.", "signature": "c2lnbmVk"}}},
                {"toolUse": {"toolUseId": "tooluse_a", "name": "bash", "input": {"command": "pytest -x"}}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"toolResult": {"toolUseId": "tooluse_a", "content": [{"text": "1 failed"}], "status": "error"}}
            ],
        },
        {
            "role": "assistant",
            "content": [{"reasoningContent": {"redactedContent": b"\x00opaque"}}, {"text": "x is 1."}],
        },
    ]
    system = [{"text": "You are a careful coding agent. Ünïcode stays as it is: ✓"}]
    session = client.create_session().id
    client.append_converse(session, messages, system=system)
    assert client.render_converse(session) == {"messages": messages, "system": system}
    view = client.render_view(session, ViewFormat.BEDROCK_CONVERSE)
    assert view.warnings == () and view.system == system
