"""Provider formats through contextd and back (contextd_client/formats, engine/render).

The pipeline, without a server: provider dicts -> the thin client's
converters -> api mapping -> append checks and tool-result linking -> stored
items -> a view in either format -> (for the cross-format trips) the other
converter. What the formats cannot carry is written down where a test
strips it before comparing.
"""

from __future__ import annotations

import base64
import copy
import json
import re
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contextd.engine.errors import FieldViolation, InvalidArgument
from contextd.engine.model import Item, Role
from contextd.engine.pipeline import identity_view as build_view
from contextd.engine.render.base import ViewWarning
from contextd.engine.render.openai import render_openai
from contextd.engine.view import ViewFormat, ViewRequest
from contextd_client import Usage
from contextd_client.formats import items_from_anthropic, items_from_openai
from contextd_client.v1 import content_pb2 as pb
from tests.helpers import counter, items_from_anthropic_messages, items_from_openai_messages, make_session
from tests.validators import check_anthropic, check_openai

Message = dict[str, Any]

PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01"
PNG_B64 = base64.b64encode(PNG).decode("ascii")
PNG_URI = f"data:image/png;base64,{PNG_B64}"


# ----------------------------------------------------------------- pipeline


def openai_view(items: list[Item]) -> list[Message]:
    """The messages an OpenAI view of `items` carries, parsed from its JSON text."""
    view = build_view(make_session(len(items)), items, ViewRequest(ViewFormat.OPENAI_CHAT), counter())
    assert view.system_json == ""
    messages: list[Message] = json.loads(view.messages_json)
    return messages


def anthropic_view(items: list[Item]) -> tuple[Any, list[Message]]:
    """(system, messages) of an Anthropic view of `items`, parsed from its JSON text."""
    view = build_view(make_session(len(items)), items, ViewRequest(ViewFormat.ANTHROPIC_MESSAGES), counter())
    system = json.loads(view.system_json) if view.system_json else None
    messages: list[Message] = json.loads(view.messages_json)
    return system, messages


def openai_round_trip(messages: list[Message]) -> list[Message]:
    return openai_view(items_from_openai_messages(messages))


def openai_via_anthropic(messages: list[Message]) -> list[Message]:
    """OpenAI messages -> items -> Anthropic view -> items -> OpenAI view."""
    system, anthropic = anthropic_view(items_from_openai_messages(messages))
    return openai_view(items_from_anthropic_messages(anthropic, system))


def without(messages: list[Message], *keys: str) -> list[Message]:
    """`messages` with `keys` removed from each message (what a trip cannot carry)."""
    return [{k: v for k, v in m.items() if k not in keys} for m in messages]


# ------------------------------------------------------ an OpenAI conversation

OPENAI_CONVERSATION: list[Message] = [
    {"role": "system", "content": "You are a careful coding agent."},
    {
        "role": "user",
        "content": [
            {"type": "text", "text": "Here is the failing screen. Does a.py exist?"},
            {"type": "image_url", "image_url": {"url": PNG_URI}},
        ],
    },
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "read_file", "arguments": json.dumps({"path": "a.py"})},
            },
            {
                "id": "call_2",
                "type": "function",
                "function": {
                    "name": "list_dir",
                    "arguments": json.dumps({"path": ".", "depth": 2, "hidden": False, "glob": "*.py", "ratio": 0.5}),
                },
            },
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "print('hi')\n"},
    # `is_error` is the trace extension the client accepts; Chat Completions has no such field.
    {"role": "tool", "tool_call_id": "call_2", "content": "Permission denied: .", "is_error": True},
    {"role": "assistant", "content": "a.py exists and prints hi; listing the directory failed."},
]


def test_openai_conversation_is_stored_as_expected() -> None:
    items = items_from_openai_messages(OPENAI_CONVERSATION)
    assert [i.role for i in items] == [Role.SYSTEM, Role.USER, Role.ASSISTANT, Role.TOOL, Role.TOOL, Role.ASSISTANT]
    assert [i.seq for i in items] == [1, 2, 3, 4, 5, 6]
    first, second = items[3].tool_result, items[4].tool_result
    assert first is not None and second is not None
    assert (first.name, first.is_error) == ("read_file", False)  # name filled in from the call
    assert (second.name, second.is_error) == ("list_dir", True)
    assert all(len(i.content_hash) == 64 for i in items)
    assert items[0].token_count == 7  # "You are a careful coding agent." in cl100k_base


def test_openai_conversation_round_trips() -> None:
    rendered = openai_round_trip(OPENAI_CONVERSATION)
    # is_error has no Chat Completions field: it is kept in the history (and in
    # Anthropic views) but cannot come back in this format.
    assert rendered == without(OPENAI_CONVERSATION, "is_error")
    calls = rendered[2]["tool_calls"]
    assert [c["function"]["arguments"] for c in calls] == [
        '{"path": "a.py"}',
        '{"path": ".", "depth": 2, "hidden": false, "glob": "*.py", "ratio": 0.5}',
    ]


def test_openai_conversation_as_anthropic() -> None:
    system, messages = anthropic_view(items_from_openai_messages(OPENAI_CONVERSATION))
    assert system == "You are a careful coding agent."
    assert messages == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Here is the failing screen. Does a.py exist?"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG_B64}},
            ],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": "call_1", "name": "read_file", "input": {"path": "a.py"}},
                {
                    "type": "tool_use",
                    "id": "call_2",
                    "name": "list_dir",
                    "input": {"path": ".", "depth": 2, "hidden": False, "glob": "*.py", "ratio": 0.5},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "call_1", "content": "print('hi')\n"},
                {"type": "tool_result", "tool_use_id": "call_2", "content": "Permission denied: .", "is_error": True},
            ],
        },
        {"role": "assistant", "content": "a.py exists and prints hi; listing the directory failed."},
    ]


def test_openai_conversation_survives_a_trip_through_anthropic() -> None:
    # Arguments come back byte-identical only because they were written the way
    # the Anthropic converter writes an object: json.dumps default separators.
    assert openai_via_anthropic(OPENAI_CONVERSATION) == without(OPENAI_CONVERSATION, "is_error")


def test_is_error_survives_the_anthropic_trip_in_the_history() -> None:
    system, anthropic = anthropic_view(items_from_openai_messages(OPENAI_CONVERSATION))
    items = items_from_anthropic_messages(anthropic, system)
    assert [i.tool_result.is_error for i in items if i.tool_result is not None] == [False, True]


@pytest.mark.parametrize(
    ("arguments", "after_anthropic"),
    [
        pytest.param('{"path":"a.py"}', '{"path": "a.py"}', id="compact-separators"),
        pytest.param('{\n  "path": "a.py"\n}', '{"path": "a.py"}', id="indented"),
        pytest.param('{"q": "\\u00e9"}', '{"q": "é"}', id="ascii-escapes"),
        pytest.param('{"n": 1.0e2}', '{"n": 100.0}', id="number-spelling"),
        pytest.param('{"a": 1, "a": 2}', '{"a": 2}', id="duplicate-keys"),
    ],
)
def test_arguments_text_that_an_anthropic_object_cannot_keep(arguments: str, after_anthropic: str) -> None:
    messages: list[Message] = [
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}],
        },
    ]
    # Within one format the text is kept byte for byte ...
    assert openai_round_trip(messages) == messages
    # ... but Anthropic carries an object, and the text is rewritten from it.
    trip = openai_via_anthropic(messages)
    assert trip[1]["tool_calls"][0]["function"]["arguments"] == after_anthropic


def test_what_the_anthropic_trip_cannot_carry() -> None:
    messages: list[Message] = [
        {"role": "developer", "content": "Be brief.", "name": "ops"},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": PNG_URI, "detail": "high"}}]},
        {"role": "user", "content": "and this", "name": "alice"},
        {"role": "assistant", "content": "ok", "reasoning": "thinking about it"},
    ]
    assert openai_round_trip(messages) == [
        {"role": "system", "content": "Be brief.", "name": "ops"},  # developer is stored as system
        messages[1],
        messages[2],
        {"role": "assistant", "content": "ok"},  # reasoning has no Chat Completions field
    ]
    assert openai_via_anthropic(messages) == [
        {"role": "system", "content": "Be brief."},  # no participant names in Messages
        {
            # Messages has no image detail, and merges consecutive user turns into one.
            "role": "user",
            "content": [{"type": "image_url", "image_url": {"url": PNG_URI}}, {"type": "text", "text": "and this"}],
        },
        {"role": "assistant", "content": "ok"},
    ]


def test_openai_render_reports_what_it_drops() -> None:
    items = items_from_openai_messages([{"role": "assistant", "content": "ok", "reasoning_content": "hmm"}])
    assert render_openai(items).warnings == [
        ViewWarning("REASONING_DROPPED", "seq 1: Chat Completions has no field for reasoning; left out")
    ]
    assert render_openai(items_from_openai_messages(OPENAI_CONVERSATION)).warnings == [
        ViewWarning("IS_ERROR_DROPPED", "seq 5: Chat Completions tool messages have no error flag; left out")
    ]


def test_a_wrong_tool_name_on_a_tool_message_is_rejected_at_append() -> None:
    messages: list[Message] = [
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "c1", "name": "cat", "content": "x"},
    ]
    with pytest.raises(InvalidArgument) as caught:
        items_from_openai_messages(messages)
    assert caught.value.violations == (
        FieldViolation("items[2].content[0].tool_result.name", "'cat' does not match the call's tool 'ls'"),
    )


# --------------------------------------------------- an Anthropic conversation

ANTHROPIC_SYSTEM: list[Message] = [
    {"type": "text", "text": "You are a careful coding agent."},
    {"type": "text", "text": "Answer briefly."},
]

ANTHROPIC_CONVERSATION: list[Message] = [
    {
        "role": "user",
        "content": [
            {"type": "text", "text": "Run the tests; here is the error."},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG_B64}},
        ],
    },
    {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "Run pytest first.", "signature": "EqQBCkYIBxgCKkBsig=="},
            {"type": "text", "text": "Running the tests."},
            {"type": "tool_use", "id": "toolu_01", "name": "bash", "input": {"command": "pytest -q", "timeout": 60}},
        ],
    },
    {
        "role": "user",
        "content": [
            {
                "type": "tool_result",
                "tool_use_id": "toolu_01",
                "content": [
                    {"type": "text", "text": "1 failed, 3 passed"},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG_B64}},
                ],
                "is_error": True,
            },
            {"type": "text", "text": "Fix it, please."},
        ],
    },
    {
        "role": "assistant",
        "content": [
            {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4a"},
            {
                "type": "tool_use",
                "id": "toolu_02",
                "name": "edit",
                "input": {"path": "a.py", "old": "x = 1", "new": "x = 2"},
            },
        ],
    },
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_02", "content": "ok"}]},
    {"role": "assistant", "content": "Fixed: x is now 2."},
]


def test_anthropic_conversation_is_stored_as_expected() -> None:
    items = items_from_anthropic_messages(ANTHROPIC_CONVERSATION, ANTHROPIC_SYSTEM)
    # Each tool_result becomes a tool item; the user text after it a user item of its own.
    assert [i.role for i in items] == [
        Role.SYSTEM,
        Role.USER,
        Role.ASSISTANT,
        Role.TOOL,
        Role.USER,
        Role.ASSISTANT,
        Role.TOOL,
        Role.ASSISTANT,
    ]
    names = [(i.tool_result.tool_use_id, i.tool_result.name) for i in items if i.tool_result is not None]
    assert names == [("toolu_01", "bash"), ("toolu_02", "edit")]


def test_anthropic_conversation_round_trips() -> None:
    system, messages = anthropic_view(items_from_anthropic_messages(ANTHROPIC_CONVERSATION, ANTHROPIC_SYSTEM))
    assert system == ANTHROPIC_SYSTEM
    assert messages == ANTHROPIC_CONVERSATION
    # Key order of tool inputs is kept too, not just dict equality.
    assert list(messages[3]["content"][1]["input"]) == ["path", "old", "new"]


def test_anthropic_string_system_round_trips() -> None:
    messages = [{"role": "user", "content": "hi"}]
    assert anthropic_view(items_from_anthropic_messages(messages, "Be brief.")) == ("Be brief.", messages)


def test_anthropic_conversation_as_openai() -> None:
    items = items_from_anthropic_messages(ANTHROPIC_CONVERSATION, ANTHROPIC_SYSTEM)
    assert openai_view(items) == [
        {
            "role": "system",
            "content": [
                {"type": "text", "text": "You are a careful coding agent."},
                {"type": "text", "text": "Answer briefly."},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Run the tests; here is the error."},
                {"type": "image_url", "image_url": {"url": PNG_URI}},
            ],
        },
        {
            "role": "assistant",
            "content": "Running the tests.",
            "tool_calls": [
                {
                    "id": "toolu_01",
                    "type": "function",
                    "function": {"name": "bash", "arguments": '{"command": "pytest -q", "timeout": 60}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_01", "content": "1 failed, 3 passed"},
        {"role": "user", "content": "Fix it, please."},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "toolu_02",
                    "type": "function",
                    "function": {"name": "edit", "arguments": '{"path": "a.py", "old": "x = 1", "new": "x = 2"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_02", "content": "ok"},
        {"role": "assistant", "content": "Fixed: x is now 2."},
    ]
    assert [w.code for w in render_openai(items).warnings] == [
        "REASONING_DROPPED",
        "TOOL_RESULT_MEDIA_DROPPED",
        "IS_ERROR_DROPPED",
        "REASONING_DROPPED",
    ]


# ---------------------------------------------------------------- properties

_texts = st.text(min_size=1, max_size=20)
_names = st.from_regex(r"[A-Za-z0-9_-]{1,12}", fullmatch=True)
_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
# What a model emits and the Anthropic converter writes: default separators, UTF-8 kept.
_arguments = st.dictionaries(st.text(max_size=8), _json_values, max_size=4).map(
    lambda d: json.dumps(d, ensure_ascii=False)
)
_text_parts = st.lists(_texts.map(lambda t: {"type": "text", "text": t}), min_size=2, max_size=3)
_image_parts = st.builds(
    lambda media, data: {
        "type": "image_url",
        "image_url": {"url": f"data:{media};base64,{base64.b64encode(data).decode('ascii')}"},
    },
    st.sampled_from(["image/png", "image/jpeg", "image/gif", "image/webp"]),
    st.binary(min_size=1, max_size=24),
)
# A lone text part renders as a plain string, so lists hold two parts or more (or one image).
_user_contents = st.one_of(
    _texts,
    _text_parts,
    st.lists(st.one_of(_texts.map(lambda t: {"type": "text", "text": t}), _image_parts), min_size=2, max_size=3),
    _image_parts.map(lambda p: [p]),
)
_tool_contents = st.one_of(st.just(""), _texts, _text_parts)


@st.composite
def openai_conversations(draw: st.DrawFn, *, names: bool = True) -> list[Message]:
    """A well-formed conversation: [system] (user (assistant calls, tool results)* assistant)+."""

    def named(message: Message) -> Message:
        if names and draw(st.booleans()):
            message["name"] = draw(_names)
        return message

    messages: list[Message] = []
    if draw(st.booleans()):
        messages.append(named({"role": "system", "content": draw(st.one_of(_texts, _text_parts))}))
    calls_made = 0
    for _ in range(draw(st.integers(1, 3))):
        messages.append(named({"role": "user", "content": draw(_user_contents)}))
        for _ in range(draw(st.integers(0, 2))):
            calls = []
            for _ in range(draw(st.integers(1, 3))):
                calls_made += 1
                call_id = f"call_{calls_made}_{draw(st.text('abcdefXYZ019', max_size=6))}"
                function = {"name": draw(_names), "arguments": draw(_arguments)}
                calls.append({"id": call_id, "type": "function", "function": function})
            content = draw(st.one_of(st.none(), _texts, _text_parts))
            messages.append(named({"role": "assistant", "content": content, "tool_calls": calls}))
            for call in calls:
                tool: Message = {"role": "tool", "tool_call_id": call["id"], "content": draw(_tool_contents)}
                if draw(st.booleans()):
                    tool["is_error"] = True
                messages.append(tool)
        messages.append(named({"role": "assistant", "content": draw(st.one_of(_texts, _text_parts))}))
    return messages


@settings(max_examples=150, deadline=None)
@given(openai_conversations())
def test_any_openai_conversation_round_trips(messages: list[Message]) -> None:
    original = copy.deepcopy(messages)
    assert openai_round_trip(messages) == without(original, "is_error")
    assert messages == original  # the converters do not touch their input


@settings(max_examples=150, deadline=None)
@given(openai_conversations())
def test_any_openai_conversation_survives_a_trip_through_anthropic(messages: list[Message]) -> None:
    # Names and is_error cannot come back (see test_what_the_anthropic_trip_cannot_carry).
    assert openai_via_anthropic(messages) == without(messages, "is_error", "name")


@settings(max_examples=100, deadline=None)
@given(openai_conversations(names=False))
def test_anthropic_views_keep_the_messages_api_invariants(messages: list[Message]) -> None:
    system, anthropic = anthropic_view(items_from_openai_messages(messages))
    check_anthropic(system, anthropic)
    check_openai(openai_view(items_from_openai_messages(messages)))


# ------------------------------------------------------------ converter input


def test_openai_converter_extensions() -> None:
    items = items_from_openai(
        [
            {"role": "developer", "content": "rules"},
            {
                "role": "user",
                "content": [{"type": "image_url", "image_url": {"url": "https://x/a.png", "detail": "low"}}],
            },
            {
                "role": "assistant",
                "content": [{"type": "refusal", "refusal": "I can't."}],
                "reasoning": "why not",
                "tool_calls": [
                    {"id": "c1", "function": {"name": "f", "arguments": {"q": "é", "n": [1, 2]}}},
                    {"id": "c2", "name": "g", "arguments": '{"x":1}'},  # a recorded trace's flat form
                    {"id": "c3", "type": "function", "function": {"name": "h"}},
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": None, "name": "f", "is_error": True},
            {
                "role": "user",
                "content": [
                    {
                        "type": "file",
                        "file": {"filename": "a.pdf", "file_data": "data:application/pdf;base64,JVBERg=="},
                    },
                    {"type": "file", "file": {"file_id": "file-123"}},
                ],
            },
        ]
    )
    assert items == [
        pb.Item(role=pb.ROLE_SYSTEM, content=[pb.ContentBlock(text=pb.TextBlock(text="rules"))]),
        pb.Item(
            role=pb.ROLE_USER,
            content=[pb.ContentBlock(image=pb.ImageBlock(uri="https://x/a.png", detail="low"))],
        ),
        pb.Item(
            role=pb.ROLE_ASSISTANT,
            content=[
                pb.ContentBlock(reasoning=pb.ReasoningBlock(text="why not")),
                pb.ContentBlock(text=pb.TextBlock(text="I can't.")),
                pb.ContentBlock(tool_use=pb.ToolUseBlock(id="c1", name="f", input_json='{"q": "é", "n": [1, 2]}')),
                pb.ContentBlock(tool_use=pb.ToolUseBlock(id="c2", name="g", input_json='{"x":1}')),
                pb.ContentBlock(tool_use=pb.ToolUseBlock(id="c3", name="h", input_json="{}")),
            ],
        ),
        pb.Item(
            role=pb.ROLE_TOOL,
            content=[pb.ContentBlock(tool_result=pb.ToolResultBlock(tool_use_id="c1", is_error=True, name="f"))],
        ),
        pb.Item(
            role=pb.ROLE_USER,
            content=[
                pb.ContentBlock(document=pb.DocumentBlock(media_type="application/pdf", data=b"%PDF", title="a.pdf")),
                pb.ContentBlock(document=pb.DocumentBlock(uri="file-123")),
            ],
        ),
    ]


def test_anthropic_converter_splits_user_turns_in_order() -> None:
    items = items_from_anthropic(
        [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "a"},
                    {"type": "tool_result", "tool_use_id": "c1", "content": ""},
                    {"type": "document", "source": {"type": "text", "data": "notes"}, "title": "n.txt"},
                    {"type": "document", "source": {"type": "url", "url": "https://x/a.pdf"}},
                    {"type": "tool_result", "tool_use_id": "c2"},
                ],
            },
            {"role": "assistant", "content": ""},
        ],
        system="",
    )
    assert items == [
        pb.Item(role=pb.ROLE_USER, content=[pb.ContentBlock(text=pb.TextBlock(text="a"))]),
        pb.Item(role=pb.ROLE_TOOL, content=[pb.ContentBlock(tool_result=pb.ToolResultBlock(tool_use_id="c1"))]),
        pb.Item(
            role=pb.ROLE_USER,
            content=[
                pb.ContentBlock(document=pb.DocumentBlock(media_type="text/plain", text="notes", title="n.txt")),
                pb.ContentBlock(document=pb.DocumentBlock(uri="https://x/a.pdf")),
            ],
        ),
        pb.Item(role=pb.ROLE_TOOL, content=[pb.ContentBlock(tool_result=pb.ToolResultBlock(tool_use_id="c2"))]),
        pb.Item(role=pb.ROLE_ASSISTANT),  # empty: the service's checks reject it, naming the field
    ]


@pytest.mark.parametrize(
    ("messages", "error"),
    [
        (
            [{"role": "user", "content": "hi"}, {"role": "function", "content": "x"}],
            "messages[1].role: unsupported role 'function' (system, developer, user, assistant, tool)",
        ),
        ([{"content": "x"}], "messages[0].role: unsupported role None (system, developer, user, assistant, tool)"),
        (
            [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "a"},
                        {"type": "image_url", "image_url": {"url": "data:image/png,abc"}},
                    ],
                }
            ],
            "messages[0].content[1]: only base64 data URIs are supported",
        ),
        (
            [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64"}}]}],
            "messages[0].content[0]: only base64 data URIs are supported",
        ),
        (
            [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,@@@@"}}]}],
            "messages[0].content[0]: bad base64 (Only base64 data is allowed)",
        ),
        (
            [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}],
            "messages[0].content[0].type: unsupported content part 'input_audio'",
        ),
        (
            [{"role": "user", "content": {"text": "x"}}],
            "messages[0].content: expected a string or a list of parts, not dict",
        ),
        (
            [
                {
                    "role": "assistant",
                    "tool_calls": [{"id": "c1", "function": {"name": "f"}}, {"id": "c2", "function": {}}],
                }
            ],
            "messages[0].tool_calls[1]: a tool call needs an id and a function name",
        ),
        (
            [{"role": "assistant", "tool_calls": [{"function": {"name": "f"}}]}],
            "messages[0].tool_calls[0]: a tool call needs an id and a function name",
        ),
        (
            [{"role": "tool", "content": "x"}],
            "messages[0].tool_call_id: a tool message needs the id of the call it answers",
        ),
        ([{"role": "tool", "tool_call_id": 7, "content": "x"}], "messages[0].tool_call_id: expected a string, not int"),
        (
            [{"role": "assistant", "tool_calls": [{"id": 7, "function": {"name": "f"}}]}],
            "messages[0].tool_calls[0].id: expected a string, not int",
        ),
        (
            [{"role": "assistant", "tool_calls": [{"id": "c1", "function": {"name": ["f"]}}]}],
            "messages[0].tool_calls[0].function.name: expected a string, not list",
        ),
        (
            [{"role": "user", "content": [{"type": "file", "file": {}}]}],
            "messages[0].content[0].file: needs file_data or file_id",
        ),
        (
            [{"role": "user", "content": [{"type": "file", "file": {"file_data": "JVBERg=="}}]}],
            "messages[0].content[0].file.file_data: expected a base64 data URI",
        ),
        ([{"role": "user", "content": [{"type": "text"}]}], "messages[0].content[0].text: missing"),
        (
            [{"role": "user", "content": [{"type": "text", "text": 3}]}],
            "messages[0].content[0].text: expected a string, not int",
        ),
        (
            [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}],
            "messages[0].content[0].image_url.url: missing",
        ),
        (
            [{"role": "user", "content": [{"type": "image_url", "image_url": "https://x/a.png"}]}],
            "messages[0].content[0].image_url: expected an object, not str",
        ),
        ([{"role": "user", "content": ["hi"]}], "messages[0].content[0]: expected an object, not str"),
        ([["user", "hi"]], "messages[0]: expected an object, not list"),
        (
            [{"role": "assistant", "tool_calls": ["c1"]}],
            "messages[0].tool_calls[0]: expected an object, not str",
        ),
    ],
)
def test_openai_converter_errors_name_the_field(messages: list[Any], error: str) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(error)}$"):
        items_from_openai(messages)


@pytest.mark.parametrize(
    ("messages", "system", "error"),
    [
        ([{"role": "system", "content": "x"}], None, "messages[0].role: unsupported role 'system' (user, assistant)"),
        (
            [{"role": "assistant", "content": [{"type": "server_tool_use", "id": "s1"}]}],
            None,
            "messages[0].content[0].type: unsupported block 'server_tool_use'",
        ),
        ([], [{"type": "bogus"}], "system[0].type: unsupported block 'bogus'"),
        (
            [
                {
                    "role": "user",
                    "content": [
                        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "@@"}}
                    ],
                }
            ],
            None,
            "messages[0].content[0].source.data: bad base64 (Only base64 data is allowed)",
        ),
        (
            [{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png"}}]}],
            None,
            "messages[0].content[0].source.data: missing",
        ),
        (
            [{"role": "user", "content": [{"type": "image", "source": {"type": "file", "file_id": "f1"}}]}],
            None,
            "messages[0].content[0].source.type: unsupported source 'file'",
        ),
        (
            [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "a"},
                        {"type": "image", "source": {"type": "text", "data": "x"}},
                    ],
                }
            ],
            None,
            "messages[0].content[1].source.type: unsupported source 'text'",
        ),
        (
            [{"role": "user", "content": [{"type": "image"}]}],
            None,
            "messages[0].content[0].source: expected an object, not NoneType",
        ),
        (
            [{"role": "user", "content": [{"type": "image", "source": {"type": "url"}}]}],
            None,
            "messages[0].content[0].source.url: missing",
        ),
        ([{"role": "user", "content": [{"type": "tool_result"}]}], None, "messages[0].content[0].tool_use_id: missing"),
        (
            [
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "c1", "content": [{"type": "text"}]}],
                }
            ],
            None,
            "messages[0].content[0].content[0].text: missing",
        ),
        (
            [{"role": "assistant", "content": [{"type": "tool_use", "id": 7, "name": "f", "input": {}}]}],
            None,
            "messages[0].content[0].id: expected a string, not int",
        ),
        (
            [{"role": "assistant", "content": [{"type": "tool_use", "id": "c1"}]}],
            None,
            "messages[0].content[0].name: missing",
        ),
        (
            [{"role": "assistant", "content": [{"type": "redacted_thinking"}]}],
            None,
            "messages[0].content[0].data: missing",
        ),
        ([{"role": "user", "content": 5}], None, "messages[0].content: expected a string or a list of blocks, not int"),
        (
            [{"role": "user", "content": {"type": "text"}}],
            None,
            "messages[0].content: expected a string or a list of blocks, not dict",
        ),
        (["hi"], None, "messages[0]: expected an object, not str"),
    ],
)
def test_anthropic_converter_errors_name_the_field(messages: list[Any], system: Any, error: str) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(error)}$"):
        items_from_anthropic(messages, system)


def test_data_uris_may_carry_parameters_before_base64() -> None:
    [item] = items_from_openai(
        [
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": "data:image/png;name=a.png;base64,iVBORw0KGgo="}}
                ],
            }
        ]
    )
    image = item.content[0].image
    assert (image.media_type, image.data) == ("image/png", b"\x89PNG\r\n\x1a\n")


def test_messages_that_carry_nothing_are_skipped_and_refusals_kept() -> None:
    items = items_from_openai(
        [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": ""},
            {"role": "assistant", "content": None, "refusal": "I can't help with that."},
            {"role": "user", "content": ""},
        ]
    )
    assert [(i.role, i.content[0].text.text) for i in items] == [
        (pb.ROLE_USER, "hi"),
        (pb.ROLE_ASSISTANT, "I can't help with that."),
    ]


def test_empty_arguments_mean_no_arguments() -> None:
    [item] = items_from_openai(
        [
            {
                "role": "assistant",
                "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "now", "arguments": ""}}],
            }
        ]
    )
    assert item.content[0].tool_use.input_json == "{}"


def test_a_providers_usage_as_contextd_takes_it() -> None:
    anthropic = {"input_tokens": 12, "output_tokens": 80, "cache_read_input_tokens": 9000}
    anthropic["cache_creation_input_tokens"] = 300
    assert Usage.from_anthropic(anthropic, "claude-sonnet-4") == Usage(
        "anthropic", "claude-sonnet-4", 12, 80, 9000, 300
    )
    # The SDKs' objects, with fields left unset (None) by a provider that did not cache.
    sdk = SimpleNamespace(input_tokens=12, output_tokens=80, cache_read_input_tokens=None)
    assert Usage.from_anthropic(sdk) == Usage("anthropic", "", 12, 80, 0, 0)
    # Only the breakdown by cache lifetime.
    by_ttl = {"input_tokens": 5, "cache_creation": {"ephemeral_5m_input_tokens": 200, "ephemeral_1h_input_tokens": 50}}
    assert Usage.from_anthropic(by_ttl).cache_write_tokens == 250
    # OpenAI counts the cached tokens inside the prompt's: Chat Completions, and Responses.
    details = SimpleNamespace(cached_tokens=9000)
    chat = SimpleNamespace(prompt_tokens=9012, completion_tokens=80, prompt_tokens_details=details)
    assert Usage.from_openai(chat, "gpt-4o") == Usage("openai", "gpt-4o", 12, 80, 9000, 0)
    assert Usage.from_openai({"prompt_tokens": 40, "completion_tokens": 2}) == Usage("openai", "", 40, 2, 0, 0)
    responses = {"input_tokens": 9012, "output_tokens": 80, "input_tokens_details": {"cached_tokens": 9000}}
    assert Usage.from_openai(responses) == Usage("openai", "", 12, 80, 9000, 0)
    # A whole response, or another provider's usage, is refused: a report of zeros would stand.
    for wrong, read in ((SimpleNamespace(usage=chat), Usage.from_openai), (chat, Usage.from_anthropic)):
        with pytest.raises(ValueError, match="usage"):
            read(wrong)
